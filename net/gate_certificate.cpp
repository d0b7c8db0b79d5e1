// The gate's certificate proof (net/gate.hpp, gate_options::
// certificate_proof): with certificates and no cluster secret, a connector
// proves it holds a certificate of the cluster's CA, and its key, before the
// listener makes any TLS state for it.
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <memory>
#include <string>

#include "net/gate.hpp"
#include "net/job_ca.hpp"
#include "net/secure_link_detail.hpp"

namespace troupe::gate_certificate {

namespace {

using bio_ptr = std::unique_ptr<BIO, decltype(&BIO_free)>;
using x509_ptr = std::unique_ptr<X509, decltype(&X509_free)>;
using pkey_ptr = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;
using md_ctx_ptr = std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)>;

bio_ptr memory(std::string_view pem) {
  return {BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), BIO_free};
}

bio_ptr file(const std::string& path) {
  return {BIO_new_file(path.c_str(), "r"), BIO_free};
}

// SHA-256 for EC and RSA keys; none for Ed25519/Ed448, which hash themselves.
const EVP_MD* digest_for(EVP_PKEY* key) {
  const int id = EVP_PKEY_get_base_id(key);
  return id == EVP_PKEY_ED25519 || id == EVP_PKEY_ED448 ? nullptr : EVP_sha256();
}

// The CA certificates `sec` trusts, in a store; null when there are none.
std::unique_ptr<X509_STORE, decltype(&X509_STORE_free)> trust_store(const link_security& sec) {
  std::unique_ptr<X509_STORE, decltype(&X509_STORE_free)> store(X509_STORE_new(), X509_STORE_free);
  auto in = sec.identity ? memory(sec.identity->ca_pem) : file(sec.ca_file);
  int added = 0;
  while (in && store) {
    x509_ptr ca(PEM_read_bio_X509(in.get(), nullptr, nullptr, nullptr), X509_free);
    if (!ca) break;
    added += X509_STORE_add_cert(store.get(), ca.get()) == 1;
  }
  ERR_clear_error();  // the end of the PEM stream
  if (added == 0) store.reset();
  return store;
}

}  // namespace

std::string make_proof(const link_security& sec, std::string_view transcript) {
  const auto where = sec.identity ? std::string("the job CA's certificate")
                                  : "cluster.tls.cert \"" + sec.cert_file + "\"";
  auto cert_in = sec.identity ? memory(sec.identity->cert_pem) : file(sec.cert_file);
  auto key_in = sec.identity ? memory(sec.identity->key_pem) : file(sec.key_file);
  x509_ptr cert(cert_in ? PEM_read_bio_X509(cert_in.get(), nullptr, nullptr, nullptr) : nullptr,
                X509_free);
  pkey_ptr key(key_in ? PEM_read_bio_PrivateKey(key_in.get(), nullptr, nullptr, nullptr) : nullptr,
               EVP_PKEY_free);
  if (!cert || !key)
    throw link_error(
        where + ": cannot read the certificate or its key: " + secure_link_detail::ssl_errors());
  unsigned char* der = nullptr;
  const int der_len = i2d_X509(cert.get(), &der);
  std::string certificate(der_len > 0 ? reinterpret_cast<const char*>(der) : "",
                          static_cast<std::size_t>(std::max(der_len, 0)));
  OPENSSL_free(der);
  md_ctx_ptr md(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  std::size_t sig_len = 0;
  const auto* data = reinterpret_cast<const unsigned char*>(transcript.data());
  if (!md ||
      EVP_DigestSignInit(md.get(), nullptr, digest_for(key.get()), nullptr, key.get()) != 1 ||
      EVP_DigestSign(md.get(), nullptr, &sig_len, data, transcript.size()) != 1)
    throw link_error(where + ": cannot sign with its key: " + secure_link_detail::ssl_errors());
  std::string signature(sig_len, '\0');
  if (EVP_DigestSign(md.get(), reinterpret_cast<unsigned char*>(signature.data()), &sig_len, data,
                     transcript.size()) != 1)
    throw link_error(where + ": cannot sign with its key: " + secure_link_detail::ssl_errors());
  signature.resize(sig_len);
  if (certificate.empty() || certificate.size() > gate_wire::kMaxCertBytes ||
      signature.size() > gate_wire::kMaxCertSignatureBytes)
    throw link_error(where + ": over the gate's " + std::to_string(gate_wire::kMaxCertBytes) +
                     " bytes for a certificate");
  return gate_wire::make_certificate_proof(certificate, signature);
}

std::string check_proof(const link_security& sec, std::string_view frame,
                        std::string_view transcript, const std::string& name) {
  const auto parts = gate_wire::split_certificate_proof(frame);
  if (!parts) return "not a certificate proof";
  const auto [certificate, signature] = *parts;
  const auto* p = reinterpret_cast<const unsigned char*>(certificate.data());
  x509_ptr cert(d2i_X509(nullptr, &p, static_cast<long>(certificate.size())), X509_free);
  ERR_clear_error();
  if (!cert || p != reinterpret_cast<const unsigned char*>(certificate.data()) + certificate.size())
    return "its certificate does not parse";
  auto store = trust_store(sec);
  if (!store) return "this node holds no CA certificate to check it against";
  std::unique_ptr<X509_STORE_CTX, decltype(&X509_STORE_CTX_free)> verify(X509_STORE_CTX_new(),
                                                                         X509_STORE_CTX_free);
  if (!verify || X509_STORE_CTX_init(verify.get(), store.get(), cert.get(), nullptr) != 1)
    return "cannot check its certificate";
  if (X509_verify_cert(verify.get()) != 1) {
    ERR_clear_error();
    return std::string("its certificate: ") +
           X509_verify_cert_error_string(X509_STORE_CTX_get_error(verify.get()));
  }
  if (!secure_link_detail::certificate_names(cert.get(), name))
    return "its certificate does not name the task " + name;
  EVP_PKEY* key = X509_get0_pubkey(cert.get());
  md_ctx_ptr md(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  const bool signed_it =
      key && md && EVP_DigestVerifyInit(md.get(), nullptr, digest_for(key), nullptr, key) == 1 &&
      EVP_DigestVerify(md.get(), reinterpret_cast<const unsigned char*>(signature.data()),
                       signature.size(), reinterpret_cast<const unsigned char*>(transcript.data()),
                       transcript.size()) == 1;
  ERR_clear_error();
  if (!signed_it) return "its signature does not check out with its certificate's key";
  return "";
}

}  // namespace troupe::gate_certificate
