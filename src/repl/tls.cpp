#include "repl/tls.hpp"

#include <fmt/format.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "metad/log.hpp"

namespace metad::repl {

namespace {

// The first error OpenSSL queued on this thread (its reason only: "certificate verify
// failed"), or `fallback`; the queue is emptied.
std::string openssl_reason(std::string_view fallback) {
  const unsigned long code = ERR_peek_error();
  std::string text;
  if (code != 0) {
    const char* reason = ERR_reason_error_string(code);
    text = reason != nullptr ? reason : fmt::format("OpenSSL error {:#x}", code);
  } else {
    text = fallback;
  }
  ERR_clear_error();
  return text;
}

using log::printable;  // a name from a certificate: a hostile peer chooses it

// The names, each once (a SAN entry usually repeats the CN).
std::string joined(const std::vector<std::string>& names) {
  if (names.empty()) return "no name";
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (std::find(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(i), names[i]) !=
        names.begin() + static_cast<std::ptrdiff_t>(i))
      continue;
    if (!out.empty()) out += ", ";
    out += printable(names[i]);
  }
  return out;
}

// One of the files: readable, regular; "" or why not.
std::string file_error(std::string_view flag, const std::string& path) {
  struct stat st {};
  if (path.empty()) return fmt::format("{}: no file given", flag);
  if (::stat(path.c_str(), &st) != 0)
    return fmt::format("{} {}: cannot read: {}", flag, path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return fmt::format("{} {}: not a regular file", flag, path);
  if (::access(path.c_str(), R_OK) != 0)
    return fmt::format("{} {}: cannot read: {}", flag, path, std::strerror(errno));
  return {};
}

// Whether the CA in `ctx`'s store signed `cert` (with `chain` as intermediates) for a
// TLS peer of `purpose` (X509_PURPOSE_SSL_CLIENT or _SERVER); "" or why not.
std::string chain_error(SSL_CTX* ctx, X509* cert, STACK_OF(X509) * chain, int purpose) {
  X509_STORE_CTX* store = X509_STORE_CTX_new();
  if (store == nullptr) return "out of memory";
  std::string error;
  if (X509_STORE_CTX_init(store, SSL_CTX_get_cert_store(ctx), cert, chain) != 1 ||
      X509_STORE_CTX_set_purpose(store, purpose) != 1) {
    error = openssl_reason("cannot check the chain");
  } else if (X509_verify_cert(store) != 1) {
    error = X509_verify_cert_error_string(X509_STORE_CTX_get_error(store));
    ERR_clear_error();
  }
  X509_STORE_CTX_free(store);
  return error;
}

}  // namespace

std::vector<std::string> certificate_names(const x509_st* cert) {
  std::vector<std::string> names;
  if (cert == nullptr) return names;
  auto* sans =
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  if (sans != nullptr) {
    for (int i = 0; i < sk_GENERAL_NAME_num(sans); ++i) {
      const GENERAL_NAME* name = sk_GENERAL_NAME_value(sans, i);
      if (name->type != GEN_DNS) continue;
      const ASN1_IA5STRING* dns = name->d.dNSName;
      names.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(dns)),
                         static_cast<std::size_t>(ASN1_STRING_length(dns)));
    }
    GENERAL_NAMES_free(sans);
  }
  const X509_NAME* subject = X509_get_subject_name(cert);
  for (int i = X509_NAME_get_index_by_NID(subject, NID_commonName, -1); i >= 0;
       i = X509_NAME_get_index_by_NID(subject, NID_commonName, i)) {
    const ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, i));
    unsigned char* utf8 = nullptr;
    const int length = ASN1_STRING_to_UTF8(&utf8, data);
    if (length >= 0) names.emplace_back(reinterpret_cast<char*>(utf8), length);
    OPENSSL_free(utf8);
  }
  ERR_clear_error();
  return names;
}

bool certificate_names_node(const x509_st* cert, std::string_view node) {
  if (node.empty()) return false;
  for (const std::string& name : certificate_names(cert))
    if (name == node) return true;
  return false;
}

tls_context::tls_context(const tls_files& files) {
  ERR_clear_error();
  ctx_ = SSL_CTX_new(TLS_method());
  if (ctx_ == nullptr)
    throw std::runtime_error("replication TLS: " + openssl_reason("SSL_CTX_new"));
  auto fail = [&](std::string what) {
    SSL_CTX_free(ctx_);
    ctx_ = nullptr;
    throw std::runtime_error(what);
  };
  // Both ends are this binary: TLS 1.3 only, no resumption (a stream lives long and a
  // reconnect is rare), no tickets after the handshake.
  SSL_CTX_set_min_proto_version(ctx_, TLS1_3_VERSION);
  SSL_CTX_set_num_tickets(ctx_, 0);
  SSL_CTX_set_session_cache_mode(ctx_, SSL_SESS_CACHE_OFF);
  // A peer's end without close_notify (kill -9) is an end, not an error: the replication
  // protocol's frames carry their own lengths and checksums.
  SSL_CTX_set_options(ctx_, SSL_OP_NO_TICKET | SSL_OP_IGNORE_UNEXPECTED_EOF);
  // write() semantics: some bytes out is success, and the retry's buffer may move.
  SSL_CTX_set_mode(ctx_, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (SSL_CTX_use_certificate_chain_file(ctx_, files.cert.c_str()) != 1)
    fail(fmt::format("--repl-tls-cert {}: {}", files.cert, openssl_reason("no certificate")));
  const std::string mismatch =
      fmt::format("--repl-tls-key {} is not the key of --repl-tls-cert {}", files.key, files.cert);
  if (SSL_CTX_use_PrivateKey_file(ctx_, files.key.c_str(), SSL_FILETYPE_PEM) != 1) {
    if (ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH) {
      ERR_clear_error();
      fail(mismatch);
    }
    fail(fmt::format("--repl-tls-key {}: {}", files.key, openssl_reason("no private key")));
  }
  if (SSL_CTX_check_private_key(ctx_) != 1) {
    ERR_clear_error();
    fail(mismatch);
  }
  if (SSL_CTX_load_verify_locations(ctx_, files.ca.c_str(), nullptr) != 1)
    fail(fmt::format("--repl-tls-ca {}: {}", files.ca, openssl_reason("no certificate")));
  // Only this CA: the system's trusted roots are never loaded.
  SSL_CTX_set_verify(ctx_, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
}

tls_context::~tls_context() { SSL_CTX_free(ctx_); }

std::string tls_files_error(const tls_files& files, std::string_view node) {
  for (const auto& [flag, path] :
       {std::pair{"--repl-tls-cert", &files.cert}, std::pair{"--repl-tls-key", &files.key},
        std::pair{"--repl-tls-ca", &files.ca}}) {
    std::string error = file_error(flag, *path);
    if (!error.empty()) return error;
  }
  struct stat st {};
  if (::stat(files.key.c_str(), &st) == 0 && (st.st_mode & 077) != 0)
    return fmt::format(
        "--repl-tls-key {}: mode {:04o} lets group or others read the private key; chmod 600 "
        "it (or load it as a systemd credential)",
        files.key, st.st_mode & 07777);
  std::unique_ptr<tls_context> context;
  try {
    context = std::make_unique<tls_context>(files);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  SSL_CTX* ctx = context->get();
  X509* own = SSL_CTX_get0_certificate(ctx);
  STACK_OF(X509)* chain = nullptr;
  SSL_CTX_get0_chain_certs(ctx, &chain);
  for (const auto& [purpose, as] : {std::pair{X509_PURPOSE_SSL_CLIENT, "a standby (TLS client)"},
                                    std::pair{X509_PURPOSE_SSL_SERVER, "a leader (TLS server)"}}) {
    const std::string error = chain_error(ctx, own, chain, purpose);
    if (!error.empty())
      return fmt::format("--repl-tls-cert {}: not valid under --repl-tls-ca {} for {}: {}",
                         files.cert, files.ca, as, error);
  }
  if (!certificate_names_node(own, node))
    return fmt::format(
        "--repl-tls-cert {}: names {}, not this node's id {} (a subjectAltName DNS entry or the "
        "CN must be the --ha-node)",
        files.cert, joined(certificate_names(own)), printable(node));
  return {};
}

tls_stream::tls_stream(const tls_context& context, int fd, role r, std::string peer)
    : role_(r), peer_(std::move(peer)) {
  ERR_clear_error();
  ssl_ = SSL_new(context.get());
  if (ssl_ == nullptr) throw std::runtime_error("replication TLS: " + openssl_reason("SSL_new"));
  SSL_set_fd(ssl_, fd);
  SSL_set_app_data(ssl_, this);
  if (r == role::accept) {
    SSL_set_accept_state(ssl_);
    SSL_set_verify(ssl_, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, &tls_stream::verify);
  } else {
    SSL_set_connect_state(ssl_);
    SSL_set_verify(ssl_, SSL_VERIFY_PEER, &tls_stream::verify);
  }
}

tls_stream::~tls_stream() { SSL_free(ssl_); }

int tls_stream::verify(int ok, x509_store_ctx_st* store) {
  if (ok != 1 || X509_STORE_CTX_get_error_depth(store) != 0) return ok;
  auto* ssl =
      static_cast<SSL*>(X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
  auto* self = ssl != nullptr ? static_cast<tls_stream*>(SSL_get_app_data(ssl)) : nullptr;
  if (self == nullptr || self->role_ != role::connect) return 1;
  // The leader's certificate must name the leader etcd names: a certificate of another
  // node of the cluster (a standby's, stolen or not) does not make its holder a leader.
  const X509* cert = X509_STORE_CTX_get_current_cert(store);
  if (certificate_names_node(cert, self->peer_)) return 1;
  self->error_ = fmt::format("the leader's certificate names {}, not node {}",
                             joined(certificate_names(cert)), printable(self->peer_));
  X509_STORE_CTX_set_error(store, X509_V_ERR_HOSTNAME_MISMATCH);
  return 0;
}

tls_stream::status tls_stream::classify(int result) {
  const int saved_errno = errno;
  switch (SSL_get_error(ssl_, result)) {
    case SSL_ERROR_WANT_READ:
      return status::want_read;
    case SSL_ERROR_WANT_WRITE:
      return status::want_write;
    case SSL_ERROR_ZERO_RETURN:
      return status::closed;
    case SSL_ERROR_SYSCALL:
      if (ERR_peek_error() == 0) {
        if (saved_errno == 0) return status::closed;  // the connection's end
        if (error_.empty()) error_ = std::strerror(saved_errno);
        return status::failed;
      }
      break;
    default:
      break;
  }
  std::string reason = openssl_reason("TLS error");
  const long verified = SSL_get_verify_result(ssl_);
  if (error_.empty()) {
    error_ = std::move(reason);
    if (verified != X509_V_OK)
      error_ += fmt::format(": {}", X509_verify_cert_error_string(verified));
  }
  return status::failed;
}

tls_stream::status tls_stream::handshake() {
  if (established_) return status::ok;
  ERR_clear_error();
  errno = 0;
  const int r = SSL_do_handshake(ssl_);
  if (r == 1) {
    established_ = true;
    return status::ok;
  }
  return classify(r);
}

tls_stream::status tls_stream::read(std::string& into, std::size_t max) {
  char buffer[16 * 1024];  // one record at most
  std::size_t got = 0;
  while (got < max) {
    ERR_clear_error();
    errno = 0;
    std::size_t n = 0;
    const int r = SSL_read_ex(ssl_, buffer, std::min(sizeof buffer, max - got), &n);
    if (r != 1) return classify(r);
    into.append(buffer, n);
    got += n;
  }
  return status::ok;
}

tls_stream::status tls_stream::write(std::string_view bytes, std::size_t& written) {
  written = 0;
  if (bytes.empty()) return status::ok;
  ERR_clear_error();
  errno = 0;
  const int r = SSL_write_ex(ssl_, bytes.data(), bytes.size(), &written);
  if (r == 1) return status::ok;
  written = 0;
  return classify(r);
}

void tls_stream::close_notify() {
  if (!established_) return;
  ERR_clear_error();
  SSL_shutdown(ssl_);
  ERR_clear_error();
}

bool tls_stream::peer_names(std::string_view node) const {
  if (!established_ || SSL_get_verify_result(ssl_) != X509_V_OK) return false;
  return certificate_names_node(SSL_get0_peer_certificate(ssl_), node);
}

std::string tls_stream::peer_names_text() const {
  return joined(certificate_names(SSL_get0_peer_certificate(ssl_)));
}

}  // namespace metad::repl
