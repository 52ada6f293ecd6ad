// Replication over mutual TLS (--repl-tls-cert, --repl-tls-key, --repl-tls-ca;
// docs/replication.md, "TLS"): OpenSSL (TLS 1.3 only) on the link's non-blocking
// sockets. Every node holds a certificate signed by the cluster's CA that names its node
// id (a subjectAltName DNS entry, or the subject's CN), and the private key for it:
// - the leader takes a stream only from a peer whose certificate the CA signed and
//   names the node its hello claims (link.cpp checks the claim with `names`);
// - a standby follows a leader only if the leader's certificate the CA signed names the
//   node the leader key in etcd names (checked during the handshake: a leader that
//   fails it never sees the hello).
// Names are compared byte for byte: no wildcards, no case folding.
//
// tls_stream wraps one socket (not owned) in non-blocking mode: each call does what it
// can and says which readiness it waits for (want_read, want_write), so the link's poll
// loop drives handshakes and I/O like plain sends and receives. Nothing here blocks or
// logs; errors come back as text for the caller's log (never key material).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

struct ssl_ctx_st;
struct ssl_st;
struct x509_st;
struct x509_store_ctx_st;

namespace metad::repl {

struct tls_files {
  std::string cert;  // PEM: this node's certificate, then any intermediates
  std::string key;   // PEM: its private key; no access for group or others (mode 0600/0400)
  std::string ca;    // PEM: the CA (or CAs) that sign the cluster's nodes
};

// The names a certificate carries that may stand for a node id: its subjectAltName DNS
// entries, then the subject's commonName entries (UTF-8).
std::vector<std::string> certificate_names(const x509_st* cert);
// True if one of those names is exactly `node`.
bool certificate_names_node(const x509_st* cert, std::string_view node);

// Why these files cannot serve node `node` (empty: they can). Checks, in order, that each
// file is a readable regular file, that the key grants no access to group or others,
// that the key matches the certificate, that the CA signed the certificate for both
// ends of a connection (TLS client and server purposes) and that the certificate names
// `node`. The text names the flag and the file, never the key's contents.
std::string tls_files_error(const tls_files& files, std::string_view node);

// The certificate, key and CA, loaded once (a node's SSL_CTX, for both roles).
class tls_context {
 public:
  explicit tls_context(const tls_files& files);  // throws std::runtime_error
  ~tls_context();
  tls_context(const tls_context&) = delete;
  tls_context& operator=(const tls_context&) = delete;
  ssl_ctx_st* get() const { return ctx_; }

 private:
  ssl_ctx_st* ctx_ = nullptr;
};

// One connection's TLS session over a non-blocking socket it does not own.
class tls_stream {
 public:
  enum class role : std::uint8_t { accept, connect };
  // connect: `peer` is the node id the server's certificate must name (the handshake
  // fails otherwise; empty: it always fails). accept: the client must present a
  // certificate the CA signed; its names are checked against the hello by the caller.
  tls_stream(const tls_context& context, int fd, role r, std::string peer = {});
  ~tls_stream();
  tls_stream(const tls_stream&) = delete;
  tls_stream& operator=(const tls_stream&) = delete;

  enum class status : std::uint8_t {
    ok,          // done (handshake), or some bytes moved (read: stopped at `max`)
    want_read,   // call again once the socket is readable
    want_write,  // call again once the socket is writable
    closed,      // the peer ended the stream (close_notify, or the connection's end)
    failed,      // a TLS or socket error: error() says which; close the socket
  };

  status handshake();
  bool established() const { return established_; }
  // Appends what can be read now, at most `max` bytes, to `into`: ok when it stopped at
  // `max`, else why it stopped (want_read: nothing more for now). Bytes read before an
  // end or an error are appended too.
  status read(std::string& into, std::size_t max);
  // Writes some of `bytes` (one or more records), counting them in `written`: ok if any
  // went out, else why none did.
  status write(std::string_view bytes, std::size_t& written);
  // Sends close_notify if it can without waiting (best effort).
  void close_notify();

  // The established peer's certificate names `node` (accept role: the hello's claim).
  bool peer_names(std::string_view node) const;
  // The names of the peer's certificate, comma-separated, for a log line.
  std::string peer_names_text() const;
  // Why the last call failed.
  const std::string& error() const { return error_; }

 private:
  status classify(int result);
  static int verify(int ok, x509_store_ctx_st* store);
  ssl_st* ssl_ = nullptr;
  role role_;
  std::string peer_;
  std::string error_;
  bool established_ = false;
};

}  // namespace metad::repl
