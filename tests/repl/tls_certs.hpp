// Certificates for the replication TLS tests, made at test time with OpenSSL's API (no
// openssl process): a CA, and node certificates it signs (EC P-256, SHA-256), written as
// PEM files into a fresh directory that is removed with the object.
#pragma once

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "repl/tls.hpp"

namespace metad::test {

// A key and the certificate for it.
struct issued {
  EVP_PKEY* key = nullptr;
  X509* cert = nullptr;
  issued() = default;
  issued(issued&& o) noexcept : key(o.key), cert(o.cert) { o.key = nullptr, o.cert = nullptr; }
  issued& operator=(issued&& o) noexcept {
    std::swap(key, o.key);
    std::swap(cert, o.cert);
    return *this;
  }
  ~issued() {
    EVP_PKEY_free(key);
    X509_free(cert);
  }
};

inline void add_extension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) throw std::runtime_error("extension " + value);
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
}

// A certificate with subject CN `cn`, signed by `ca` (self-signed, a CA, if null). `san`:
// the subjectAltName value ("DNS:b"; empty: none); `usage`: extendedKeyUsage (empty:
// none).
inline issued issue(const std::string& cn, const issued* ca, const std::string& san = {},
                    const std::string& usage = "serverAuth,clientAuth") {
  static long serial = 1;
  issued out;
  out.key = EVP_EC_gen("P-256");
  out.cert = X509_new();
  if (out.key == nullptr || out.cert == nullptr) throw std::runtime_error("EVP_EC_gen");
  X509_set_version(out.cert, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(out.cert), serial++);
  X509_gmtime_adj(X509_getm_notBefore(out.cert), -3600);
  X509_gmtime_adj(X509_getm_notAfter(out.cert), 86400);
  X509_set_pubkey(out.cert, out.key);
  X509_NAME_add_entry_by_txt(X509_get_subject_name(out.cert), "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509* issuer = ca != nullptr ? ca->cert : out.cert;
  X509_set_issuer_name(out.cert, X509_get_subject_name(issuer));
  if (ca == nullptr) {
    add_extension(out.cert, issuer, NID_basic_constraints, "critical,CA:TRUE");
    add_extension(out.cert, issuer, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    add_extension(out.cert, issuer, NID_basic_constraints, "critical,CA:FALSE");
    add_extension(out.cert, issuer, NID_key_usage, "critical,digitalSignature");
    if (!usage.empty()) add_extension(out.cert, issuer, NID_ext_key_usage, usage);
    if (!san.empty()) add_extension(out.cert, issuer, NID_subject_alt_name, san);
  }
  if (X509_sign(out.cert, ca != nullptr ? ca->key : out.key, EVP_sha256()) == 0)
    throw std::runtime_error("X509_sign");
  return out;
}

// A scratch directory of PEM files.
class cert_dir {
 public:
  cert_dir() {
    char pattern[] = "/tmp/metad-tls-test.XXXXXX";
    if (::mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp");
    path_ = pattern;
  }
  ~cert_dir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  cert_dir(const cert_dir&) = delete;
  cert_dir& operator=(const cert_dir&) = delete;

  const std::string& path() const { return path_; }

  // name.crt and name.key (mode 0600) of `x`; returns the files (ca: `ca_file`).
  repl::tls_files write(const std::string& name, const issued& x, const std::string& ca_file) {
    const std::string cert = path_ + "/" + name + ".crt", key = path_ + "/" + name + ".key";
    write_cert(cert, x.cert);
    FILE* f = std::fopen(key.c_str(), "w");
    if (f == nullptr) throw std::runtime_error("fopen " + key);
    PEM_write_PrivateKey(f, x.key, nullptr, nullptr, 0, nullptr, nullptr);
    std::fclose(f);
    ::chmod(key.c_str(), 0600);
    return {cert, key, ca_file};
  }
  std::string write_ca(const std::string& name, const issued& ca) {
    const std::string file = path_ + "/" + name + ".crt";
    write_cert(file, ca.cert);
    return file;
  }

 private:
  static void write_cert(const std::string& file, X509* cert) {
    FILE* f = std::fopen(file.c_str(), "w");
    if (f == nullptr) throw std::runtime_error("fopen " + file);
    PEM_write_X509(f, cert);
    std::fclose(f);
  }
  std::string path_;
};

// A cluster CA, another CA, and files for nodes signed by either.
struct test_pki {
  cert_dir dir;
  issued ca = issue("hf3fs-metad test CA", nullptr);
  issued other_ca = issue("another CA", nullptr);
  std::string ca_file = dir.write_ca("ca", ca);
  std::string other_ca_file = dir.write_ca("other-ca", other_ca);

  // A node certificate of the cluster's CA naming `node` (SAN DNS and CN).
  repl::tls_files node(const std::string& node) {
    return dir.write(node, issue(node, &ca, "DNS:" + node), ca_file);
  }
  // The same, signed by the other CA (trusting the cluster's: it gets as far as
  // presenting its certificate).
  repl::tls_files foreign(const std::string& node) {
    return dir.write("foreign-" + node, issue(node, &other_ca, "DNS:" + node), ca_file);
  }
};

}  // namespace metad::test
