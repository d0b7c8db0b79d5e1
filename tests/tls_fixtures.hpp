#pragma once
// A cluster CA for the certificate tests, made with OpenSSL's API (the
// openssl command of Debian 12 cannot make an expired certificate).
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <stdexcept>
#include <string>

namespace troupe::tls_test {

struct pem_files {
  std::string cert, key;
};

class test_ca {
 public:
  // A self-signed CA named `name`, its certificate written to dir/name.pem.
  test_ca(std::string dir, const std::string& name) : dir_(std::move(dir)) {
    key_ = EVP_EC_gen("P-256");
    if (!key_) throw std::runtime_error("EVP_EC_gen failed");
    cert_ = make(name, key_, nullptr, 0, 3600, true);
    ca_file = dir_ + "/" + name + ".pem";
    write_cert(cert_, ca_file);
  }
  ~test_ca() {
    X509_free(cert_);
    EVP_PKEY_free(key_);
  }
  test_ca(const test_ca&) = delete;
  test_ca& operator=(const test_ca&) = delete;

  // A certificate for `common_name` signed by this CA, valid from now +
  // `from_s` to now + `until_s` seconds, with its key: dir/stem.pem, .key.
  pem_files issue(const std::string& common_name, const std::string& stem, long from_s = -60,
                  long until_s = 3600) {
    EVP_PKEY* key = EVP_EC_gen("P-256");
    X509* cert = make(common_name, key, cert_, from_s, until_s, false);
    pem_files out{dir_ + "/" + stem + ".pem", dir_ + "/" + stem + ".key"};
    write_cert(cert, out.cert);
    FILE* f = std::fopen(out.key.c_str(), "w");
    PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
    std::fclose(f);
    X509_free(cert);
    EVP_PKEY_free(key);
    return out;
  }

  std::string ca_file;

 private:
  X509* make(const std::string& cn, EVP_PKEY* key, X509* issuer, long from_s, long until_s,
             bool ca) {
    X509* x = X509_new();
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), serial_++);
    X509_gmtime_adj(X509_getm_notBefore(x), from_s);
    X509_gmtime_adj(X509_getm_notAfter(x), until_s);
    X509_set_pubkey(x, key);
    X509_NAME* name = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
    X509_set_issuer_name(x, issuer ? X509_get_subject_name(issuer) : name);
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer ? issuer : x, x, nullptr, nullptr, 0);
    add_ext(x, &ctx, NID_basic_constraints, ca ? "critical,CA:TRUE" : "critical,CA:FALSE");
    if (ca) add_ext(x, &ctx, NID_key_usage, "critical,keyCertSign,cRLSign");
    X509_sign(x, issuer ? key_ : key, EVP_sha256());
    return x;
  }
  static void add_ext(X509* x, X509V3_CTX* ctx, int nid, const char* value) {
    X509_EXTENSION* e = X509V3_EXT_conf_nid(nullptr, ctx, nid, value);
    X509_add_ext(x, e, -1);
    X509_EXTENSION_free(e);
  }
  static void write_cert(X509* x, const std::string& file) {
    FILE* f = std::fopen(file.c_str(), "w");
    PEM_write_X509(f, x);
    std::fclose(f);
  }

  std::string dir_;
  EVP_PKEY* key_ = nullptr;
  X509* cert_ = nullptr;
  long serial_ = 1;
};

}  // namespace troupe::tls_test
