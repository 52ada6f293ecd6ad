#include "ha/http_client.hpp"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ha/parse_int.hpp"
#include "ha/tls.hpp"

namespace metad::ha {
namespace {

int ms_until(time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - steady::now());
  return left.count() <= 0 ? 0 : static_cast<int>(std::min<long long>(left.count(), 1 << 30));
}

// Waits for `events` on fd until the deadline; false on timeout (errno = ETIMEDOUT).
bool wait_for(int fd, short events, time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, ms_until(deadline));
    if (n > 0) return true;
    if (n == 0) {
      errno = ETIMEDOUT;
      return false;
    }
    if (errno != EINTR) return false;
  }
}

bool is_ip_address(const std::string& host) {
  unsigned char bytes[sizeof(in6_addr)];
  return ::inet_pton(AF_INET, host.c_str(), bytes) == 1 ||
         ::inet_pton(AF_INET6, host.c_str(), bytes) == 1;
}

}  // namespace

std::optional<endpoint> parse_endpoint(std::string_view url) {
  constexpr std::string_view plain = "http://";
  constexpr std::string_view secure = "https://";
  const bool tls = url.substr(0, secure.size()) == secure;
  if (!tls && url.substr(0, plain.size()) != plain) return std::nullopt;
  std::string_view rest = url.substr(tls ? secure.size() : plain.size());
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  const std::size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return std::nullopt;
  const std::string_view host = rest.substr(0, colon);
  const std::string_view port = rest.substr(colon + 1);
  if (host.find_first_of("/@?#") != std::string_view::npos) return std::nullopt;
  unsigned value = 0;
  if (!parse_whole(port, value) || value == 0 || value > 65535) {
    return std::nullopt;
  }
  return endpoint{std::string(host), static_cast<std::uint16_t>(value), std::string(url), tls};
}

std::optional<std::vector<endpoint>> parse_endpoints(std::string_view urls) {
  std::vector<endpoint> out;
  while (true) {
    const std::size_t comma = urls.find(',');
    auto one = parse_endpoint(urls.substr(0, comma));
    if (!one) return std::nullopt;
    out.push_back(std::move(*one));
    if (comma == std::string_view::npos) break;
    urls.remove_prefix(comma + 1);
  }
  return out;
}

bool connection::open(const endpoint& to, time_point deadline, std::string& error,
                      const tls_context* tls) {
  close();
  certificate_refused_ = false;
  if (to.tls && tls == nullptr) {
    error = fmt::format("{}: https without TLS settings", to.url);
    return false;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(to.port);
  if (const int rc = ::getaddrinfo(to.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    error = fmt::format("{}: {}", to.url, ::gai_strerror(rc));
    return false;
  }
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      if (wait_for(fd, POLLOUT, deadline)) {
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        errno = err;
        rc = err == 0 ? 0 : -1;
      }
    }
    if (rc == 0) {
      fd_ = fd;
      ::freeaddrinfo(found);
      if (to.tls && !handshake(to, *tls, deadline, error)) {
        close();
        return false;
      }
      return true;
    }
    error = fmt::format("connect {}: {}", to.url, std::strerror(errno));
    ::close(fd);
  }
  ::freeaddrinfo(found);
  if (error.empty()) error = fmt::format("connect {}: no address", to.url);
  return false;
}

bool connection::handshake(const endpoint& to, const tls_context& tls, time_point deadline,
                           std::string& error) {
  ERR_clear_error();
  ssl_ = SSL_new(tls.native());
  if (ssl_ == nullptr || SSL_set_fd(ssl_, fd_) != 1) {
    error = fmt::format("TLS {}: {}", to.url, tls_error());
    return false;
  }
  // The certificate must name the host of the URL: an IP address in its IP SANs, a
  // DNS name in its DNS SANs (or CN). SNI only for names (RFC 6066 forbids addresses).
  if (is_ip_address(to.host)) {
    if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl_), to.host.c_str()) != 1) {
      error = fmt::format("TLS {}: {}", to.url, tls_error());
      return false;
    }
  } else if (SSL_set_tlsext_host_name(ssl_, to.host.c_str()) != 1 ||
             SSL_set1_host(ssl_, to.host.c_str()) != 1) {
    error = fmt::format("TLS {}: {}", to.url, tls_error());
    return false;
  }
  for (;;) {
    ERR_clear_error();
    const int rc = SSL_connect(ssl_);
    if (rc == 1) return true;
    const int why = SSL_get_error(ssl_, rc);
    if (why == SSL_ERROR_WANT_READ || why == SSL_ERROR_WANT_WRITE) {
      if (wait_for(fd_, why == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline)) continue;
      error = fmt::format("TLS handshake with {}: {}", to.url,
                          errno == ETIMEDOUT ? "timed out" : std::strerror(errno));
      return false;
    }
    const long verified = SSL_get_verify_result(ssl_);
    if (verified != X509_V_OK) {
      certificate_refused_ = true;
      error = fmt::format("TLS handshake with {}: its certificate does not verify: {}", to.url,
                          X509_verify_cert_error_string(verified));
      ERR_clear_error();
      return false;
    }
    if (why == SSL_ERROR_SYSCALL && ERR_peek_error() == 0) {
      error = fmt::format("TLS handshake with {}: {}", to.url,
                          errno != 0 ? std::strerror(errno) : "connection closed");
    } else {
      error = fmt::format("TLS handshake with {}: {}", to.url, tls_error());
    }
    return false;
  }
}

void connection::close() {
  if (ssl_ != nullptr) SSL_free(ssl_);
  ssl_ = nullptr;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool connection::send_all(std::string_view bytes, time_point deadline, std::string& error) {
  while (ssl_ != nullptr && !bytes.empty()) {
    ERR_clear_error();
    const int n =
        SSL_write(ssl_, bytes.data(),
                  static_cast<int>(std::min<std::size_t>(bytes.size(), std::size_t{1} << 30)));
    if (n > 0) {
      bytes.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    const int why = SSL_get_error(ssl_, n);
    if ((why == SSL_ERROR_WANT_WRITE || why == SSL_ERROR_WANT_READ) &&
        wait_for(fd_, why == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline)) {
      continue;
    }
    if (why == SSL_ERROR_WANT_WRITE || why == SSL_ERROR_WANT_READ) {
      error =
          errno == ETIMEDOUT ? "send: timed out" : fmt::format("poll: {}", std::strerror(errno));
    } else if (why == SSL_ERROR_SYSCALL && ERR_peek_error() == 0) {
      error = fmt::format("send: {}", errno != 0 ? std::strerror(errno) : "connection closed");
    } else {
      error = fmt::format("send: {}", tls_error());
    }
    return false;
  }
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n > 0) {
      bytes.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && wait_for(fd_, POLLOUT, deadline)) {
      continue;
    }
    error = fmt::format("send: {}", std::strerror(errno));
    return false;
  }
  return true;
}

// TLS: OpenSSL may already hold decrypted bytes (or need to write first), so read
// before polling, and poll for what it asks for.
connection::read_status connection::read_tls(http_reader& reader, time_point deadline,
                                             std::string& error) {
  char buffer[16384];
  for (;;) {
    ERR_clear_error();
    const int n = SSL_read(ssl_, buffer, sizeof buffer);
    if (n > 0) {
      reader.feed(std::string_view(buffer, static_cast<std::size_t>(n)));
      return read_status::progress;
    }
    const int why = SSL_get_error(ssl_, n);
    if (why == SSL_ERROR_ZERO_RETURN ||
        (why == SSL_ERROR_SYSCALL && ERR_peek_error() == 0 && errno == 0)) {
      reader.feed_eof();
      return read_status::closed;
    }
    if (why == SSL_ERROR_WANT_READ || why == SSL_ERROR_WANT_WRITE) {
      if (wait_for(fd_, why == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline)) continue;
      error = errno == ETIMEDOUT ? "timed out" : fmt::format("poll: {}", std::strerror(errno));
      return errno == ETIMEDOUT ? read_status::timeout : read_status::error;
    }
    error = why == SSL_ERROR_SYSCALL && ERR_peek_error() == 0
                ? fmt::format("recv: {}", std::strerror(errno))
                : fmt::format("recv: {}", tls_error());
    return read_status::error;
  }
}

connection::read_status connection::read_some(http_reader& reader, time_point deadline,
                                              std::string& error) {
  if (ssl_ != nullptr) return read_tls(reader, deadline, error);
  if (!wait_for(fd_, POLLIN, deadline)) {
    error = errno == ETIMEDOUT ? "timed out" : fmt::format("poll: {}", std::strerror(errno));
    return errno == ETIMEDOUT ? read_status::timeout : read_status::error;
  }
  char buffer[16384];
  for (;;) {
    const ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
    if (n > 0) {
      reader.feed(std::string_view(buffer, static_cast<std::size_t>(n)));
      return read_status::progress;
    }
    if (n == 0) {
      reader.feed_eof();
      return read_status::closed;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return read_status::progress;
    error = fmt::format("recv: {}", std::strerror(errno));
    return read_status::error;
  }
}

std::string format_post(const endpoint& to, std::string_view path, std::string_view json,
                        std::string_view authorization) {
  std::string auth;
  if (!authorization.empty()) auth = fmt::format("Authorization: {}\r\n", authorization);
  return fmt::format(
      "POST {} HTTP/1.1\r\nHost: {}:{}\r\n{}Content-Type: application/json\r\n"
      "Content-Length: {}\r\n\r\n{}",
      path, to.host, to.port, auth, json.size(), json);
}

http_client::http_client(std::vector<endpoint> endpoints, std::chrono::milliseconds connect_timeout,
                         std::shared_ptr<const tls_context> tls)
    : endpoints_(std::move(endpoints)), connect_timeout_(connect_timeout), tls_(std::move(tls)) {}

http_result http_client::post(std::string_view path, std::string_view json, time_point deadline,
                              std::string_view authorization) {
  http_result last;
  last.error = "deadline passed before any attempt";
  for (std::size_t tried = 0; tried < endpoints_.size(); ++tried) {
    if (steady::now() >= deadline) break;
    const std::string request = format_post(endpoints_[current_], path, json, authorization);
    last = attempt(request, deadline);
    if (last.ok && last.status < 500) return last;
    conn_.close();
    current_ = (current_ + 1) % endpoints_.size();
  }
  return last;
}

http_result http_client::attempt(std::string_view request, time_point deadline) {
  http_result out;
  const endpoint& to = endpoints_[current_];
  // A reused keep-alive connection may have been closed by the server while idle: if it
  // fails before any answer byte, one fresh connection to the same endpoint is tried.
  for (int round = 0; round < 2; ++round) {
    const bool reused = conn_.is_open();
    if (!reused) {
      const auto connect_by = std::min(deadline, steady::now() + connect_timeout_);
      if (!conn_.open(to, connect_by, out.error, tls_.get())) return out;
    }
    http_reader reader;
    bool got_bytes = false;
    bool failed = !conn_.send_all(request, deadline, out.error);
    while (!failed && (reader.current() == http_reader::state::head ||
                       reader.current() == http_reader::state::body)) {
      const auto status = conn_.read_some(reader, deadline, out.error);
      if (status == connection::read_status::progress) {
        got_bytes = true;
      } else if (status != connection::read_status::closed ||
                 reader.current() != http_reader::state::done) {
        failed = true;
      }
    }
    if (!failed && reader.current() == http_reader::state::done) {
      out.ok = true;
      out.status = reader.status();
      out.body = std::move(reader.body());
      out.error.clear();
      if (!reader.keep_alive()) conn_.close();
      return out;
    }
    if (reader.current() == http_reader::state::error) out.error = reader.error();
    conn_.close();
    if (!reused || got_bytes || steady::now() >= deadline) return out;
  }
  return out;
}

bool http_stream::open(const endpoint& to, std::string_view path, std::string_view json,
                       time_point deadline, std::string& error, const tls_context* tls,
                       std::string_view authorization) {
  close();
  if (!conn_.open(to, deadline, error, tls)) return false;
  if (!conn_.send_all(format_post(to, path, json, authorization), deadline, error)) {
    close();
    return false;
  }
  while (reader_.current() == http_reader::state::head) {
    if (conn_.read_some(reader_, deadline, error) != connection::read_status::progress) {
      if (reader_.current() == http_reader::state::head) {
        close();
        return false;
      }
    }
  }
  if (reader_.current() == http_reader::state::error) {
    error = reader_.error();
    close();
    return false;
  }
  return true;
}

http_stream::status http_stream::next_line(time_point deadline, std::string& line,
                                           std::string& error) {
  for (;;) {
    std::string& body = reader_.body();
    if (const std::size_t nl = body.find('\n'); nl != std::string::npos) {
      line.assign(body, 0, nl);
      body.erase(0, nl + 1);
      return status::line;
    }
    if (reader_.current() == http_reader::state::error) {
      error = reader_.error();
      return status::error;
    }
    if (reader_.current() == http_reader::state::done || !conn_.is_open()) {
      if (!body.empty()) {  // a last line without its newline
        line = std::move(body);
        body.clear();
        return status::line;
      }
      return status::ended;
    }
    switch (conn_.read_some(reader_, deadline, error)) {
      case connection::read_status::progress:
        break;
      case connection::read_status::timeout:
        return status::timeout;
      case connection::read_status::closed:
        conn_.close();
        break;
      case connection::read_status::error:
        conn_.close();
        return status::error;
    }
  }
}

void http_stream::close() {
  conn_.close();
  reader_.reset();
}

}  // namespace metad::ha
