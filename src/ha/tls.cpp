#include "ha/tls.hpp"

#include <fmt/format.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

namespace metad::ha {

std::string tls_error(const char* fallback) {
  std::string out;
  while (const unsigned long code = ERR_get_error()) {
    char text[256];
    ERR_error_string_n(code, text, sizeof text);
    if (!out.empty()) out += "; ";
    out += text;
  }
  return out.empty() ? std::string(fallback) : out;
}

std::shared_ptr<const tls_context> tls_context::make(const tls_files& files, std::string& error) {
  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (ctx == nullptr) {
    error = fmt::format("TLS: {}", tls_error());
    return nullptr;
  }
  std::shared_ptr<const tls_context> out(new tls_context(ctx));
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  // Partial writes over a non-blocking socket; an etcd that closes without close_notify
  // ends the stream like a TCP close (the HTTP framing says whether the answer was whole).
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
  if (files.ca.empty()) {
    if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
      error = fmt::format("TLS: the system's CA certificates: {}", tls_error());
      return nullptr;
    }
  } else if (SSL_CTX_load_verify_locations(ctx, files.ca.c_str(), nullptr) != 1) {
    error =
        fmt::format("--ha-etcd-ca {}: no usable PEM CA certificate ({})", files.ca, tls_error());
    return nullptr;
  }
  if (files.cert.empty() != files.key.empty()) {
    error = "--ha-etcd-cert and --ha-etcd-key go together";
    return nullptr;
  }
  if (!files.cert.empty()) {
    if (SSL_CTX_use_certificate_chain_file(ctx, files.cert.c_str()) != 1) {
      error =
          fmt::format("--ha-etcd-cert {}: no usable PEM certificate ({})", files.cert, tls_error());
      return nullptr;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, files.key.c_str(), SSL_FILETYPE_PEM) != 1) {
      error =
          fmt::format("--ha-etcd-key {}: no usable PEM private key ({})", files.key, tls_error());
      return nullptr;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
      error = fmt::format("--ha-etcd-key {} is not the key of --ha-etcd-cert {}", files.key,
                          files.cert);
      ERR_clear_error();
      return nullptr;
    }
  }
  return out;
}

tls_context::~tls_context() { SSL_CTX_free(ctx_); }

}  // namespace metad::ha
