// TLS for the etcd client (OpenSSL): one client context per configuration, shared by
// every connection the ha module opens (the ha thread's, a watch's, start-up's probe).
// The context verifies the server's certificate against --ha-etcd-ca (the system's CAs
// without it); each connection also checks the name in the URL against the certificate
// (connection::open, http_client.cpp).
#pragma once

#include <memory>
#include <string>

struct ssl_ctx_st;

namespace metad::ha {

struct tls_files {
  std::string ca;    // --ha-etcd-ca: PEM CA bundle; empty: the system's CAs
  std::string cert;  // --ha-etcd-cert: PEM client certificate (chain); empty: none
  std::string key;   // --ha-etcd-key: its PEM private key
};

class tls_context {
 public:
  // nullptr, and why in `error` (naming the flag and file), when a file is unusable.
  static std::shared_ptr<const tls_context> make(const tls_files& files, std::string& error);
  ~tls_context();
  tls_context(const tls_context&) = delete;
  tls_context& operator=(const tls_context&) = delete;

  ssl_ctx_st* native() const { return ctx_; }

 private:
  explicit tls_context(ssl_ctx_st* ctx) : ctx_(ctx) {}
  ssl_ctx_st* ctx_;
};

// OpenSSL's error queue as one line (and emptied); `fallback` when it is empty.
std::string tls_error(const char* fallback = "unknown TLS error");

}  // namespace metad::ha
