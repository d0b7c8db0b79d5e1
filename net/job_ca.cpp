// The job's certificate authority (net/job_ca.hpp): OpenSSL EVP and X.509.
#include "net/job_ca.hpp"

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <mutex>

#include "net/secure_link_detail.hpp"

namespace troupe {

namespace {

// What signs a certificate request: a label, so that the signature is valid
// for nothing else the key might sign.
constexpr std::string_view kRequestLabel = "troupe job CA: certificate request\n";

// A certificate's validity: from an hour back (clocks of hosts differ) for a
// year; the CA's key is gone when the chief's rendezvous ends anyway.
constexpr long kBackdateSeconds = 3600;
constexpr long kValidSeconds = 365L * 24 * 3600;

struct pkey_free {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct x509_free {
  void operator()(X509* x) const { X509_free(x); }
};
struct bio_free {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct md_ctx_free {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
using pkey_ptr = std::unique_ptr<EVP_PKEY, pkey_free>;
using x509_ptr = std::unique_ptr<X509, x509_free>;
using bio_ptr = std::unique_ptr<BIO, bio_free>;
using md_ctx_ptr = std::unique_ptr<EVP_MD_CTX, md_ctx_free>;

job_ca_error failed(const std::string& what) {
  return job_ca_error("job CA: " + what + ": " + secure_link_detail::ssl_errors());
}

pkey_ptr new_key() {
  ERR_clear_error();
  pkey_ptr k(EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519"));
  if (!k) throw failed("cannot make an Ed25519 key");
  return k;
}

std::string bio_text(BIO* b) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(b, &data);
  return n > 0 ? std::string(data, static_cast<std::size_t>(n)) : std::string();
}

std::string pem_of(X509* x) {
  bio_ptr b(BIO_new(BIO_s_mem()));
  if (!b || PEM_write_bio_X509(b.get(), x) != 1) throw failed("cannot write a certificate");
  return bio_text(b.get());
}

x509_ptr cert_of(const std::string& pem) {
  bio_ptr b(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  return x509_ptr(b ? PEM_read_bio_X509(b.get(), nullptr, nullptr, nullptr) : nullptr);
}

pkey_ptr private_key_of(const std::string& pem) {
  bio_ptr b(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  return pkey_ptr(b ? PEM_read_bio_PrivateKey(b.get(), nullptr, nullptr, nullptr) : nullptr);
}

std::string signed_text(std::string_view request) {
  std::string m(kRequestLabel);
  m.append(request);
  return m;
}

void add_extension(X509* x, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer, x, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  const bool ok = ext && X509_add_ext(x, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  if (!ok) throw failed(std::string("cannot add the extension ") + value);
}

// A certificate for `subject_key` naming `cn`, with a random serial, not yet
// signed; `issuer` null: self-issued.
x509_ptr new_certificate(const std::string& cn, EVP_PKEY* subject_key, X509* issuer) {
  x509_ptr x(X509_new());
  if (!x) throw failed("X509_new");
  std::unique_ptr<BIGNUM, decltype(&BN_free)> serial(BN_new(), BN_free);
  X509_NAME* name = X509_get_subject_name(x.get());
  const bool ok =
      X509_set_version(x.get(), 2) == 1 && serial && BN_rand(serial.get(), 120, 0, 0) == 1 &&
      BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(x.get())) &&
      X509_gmtime_adj(X509_getm_notBefore(x.get()), -kBackdateSeconds) &&
      X509_gmtime_adj(X509_getm_notAfter(x.get()), kValidSeconds) &&
      X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1,
                                 0) == 1 &&
      X509_set_issuer_name(x.get(), issuer ? X509_get_subject_name(issuer) : name) == 1 &&
      X509_set_pubkey(x.get(), subject_key) == 1;
  if (!ok) throw failed("cannot fill the certificate for " + cn);
  return x;
}

}  // namespace

struct task_key::state {
  pkey_ptr key;
};

task_key::task_key() : st_(std::make_unique<state>()) {
  st_->key = new_key();
}
task_key::~task_key() = default;

std::string task_key::public_raw() const {
  std::string out(kPublicBytes, '\0');
  std::size_t n = out.size();
  if (EVP_PKEY_get_raw_public_key(st_->key.get(), reinterpret_cast<unsigned char*>(out.data()),
                                  &n) != 1 ||
      n != kPublicBytes)
    throw failed("cannot read the public key");
  return out;
}

std::string task_key::private_pem() const {
  bio_ptr b(BIO_new(BIO_s_mem()));
  if (!b ||
      PEM_write_bio_PrivateKey(b.get(), st_->key.get(), nullptr, nullptr, 0, nullptr, nullptr) != 1)
    throw failed("cannot write the private key");
  return bio_text(b.get());
}

std::string task_key::sign_request(std::string_view request) const {
  const auto text = signed_text(request);
  std::string sig(kSignatureBytes, '\0');
  std::size_t n = sig.size();
  md_ctx_ptr ctx(EVP_MD_CTX_new());
  if (!ctx || EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, st_->key.get()) != 1 ||
      EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(sig.data()), &n,
                     reinterpret_cast<const unsigned char*>(text.data()), text.size()) != 1 ||
      n != kSignatureBytes)
    throw failed("cannot sign the certificate request");
  return sig;
}

struct job_authority::state {
  pkey_ptr key;
  x509_ptr cert;
  std::string pem;
};

job_authority::job_authority() : st_(std::make_unique<state>()) {
  st_->key = new_key();
  st_->cert = new_certificate("troupe job CA", st_->key.get(), nullptr);
  add_extension(st_->cert.get(), st_->cert.get(), NID_basic_constraints,
                "critical,CA:TRUE,pathlen:0");
  add_extension(st_->cert.get(), st_->cert.get(), NID_key_usage, "critical,keyCertSign");
  add_extension(st_->cert.get(), st_->cert.get(), NID_subject_key_identifier, "hash");
  if (X509_sign(st_->cert.get(), st_->key.get(), nullptr) <= 0)
    throw failed("cannot sign the CA's certificate");
  st_->pem = pem_of(st_->cert.get());
}
job_authority::~job_authority() = default;

const std::string& job_authority::ca_pem() const {
  return st_->pem;
}

std::string job_authority::issue(const std::string& task, std::string_view public_raw,
                                 std::string_view request, std::string_view signature) const {
  ERR_clear_error();
  if (public_raw.size() != task_key::kPublicBytes || signature.size() != task_key::kSignatureBytes)
    throw job_ca_error("a certificate request needs a 32-byte key and a 64-byte signature");
  // (The zeros of an announce without a key: a point of small order, for
  // which a zero signature verifies for a quarter of all requests.)
  if (public_raw.find_first_not_of('\0') == std::string_view::npos)
    throw job_ca_error("its certificate request carries no key");
  pkey_ptr pub(EVP_PKEY_new_raw_public_key(
      EVP_PKEY_ED25519, nullptr, reinterpret_cast<const unsigned char*>(public_raw.data()),
      public_raw.size()));
  if (!pub) throw job_ca_error("its certificate request carries no valid Ed25519 key");
  const auto text = signed_text(request);
  md_ctx_ptr ctx(EVP_MD_CTX_new());
  if (!ctx || EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, pub.get()) != 1 ||
      EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()),
                       signature.size(), reinterpret_cast<const unsigned char*>(text.data()),
                       text.size()) != 1)
    throw job_ca_error("its certificate request is not signed by the key it carries");
  auto x = new_certificate(task, pub.get(), st_->cert.get());
  add_extension(x.get(), st_->cert.get(), NID_basic_constraints, "critical,CA:FALSE");
  add_extension(x.get(), st_->cert.get(), NID_key_usage, "critical,digitalSignature");
  add_extension(x.get(), st_->cert.get(), NID_authority_key_identifier, "keyid:always");
  if (X509_sign(x.get(), st_->key.get(), nullptr) <= 0) throw failed("cannot sign for " + task);
  return pem_of(x.get());
}

task_identity job_authority::issue_self(const std::string& task) const {
  task_key key;
  const std::string request = "self:" + task;
  task_identity id;
  id.task = task;
  id.ca_pem = st_->pem;
  id.cert_pem = issue(task, key.public_raw(), request, key.sign_request(request));
  id.key_pem = key.private_pem();
  return id;
}

std::string check_task_identity(const task_identity& id) {
  ERR_clear_error();
  auto cert = cert_of(id.cert_pem);
  auto ca = cert_of(id.ca_pem);
  auto key = private_key_of(id.key_pem);
  if (!cert) return "the certificate is not a PEM certificate";
  if (!ca) return "the CA's certificate is not a PEM certificate";
  if (!key) return "the private key is not a PEM key";
  if (X509_verify(cert.get(), X509_get0_pubkey(ca.get())) != 1)
    return "the certificate is not signed by the job CA";
  if (X509_check_private_key(cert.get(), key.get()) != 1)
    return "the certificate is not for this task's key";
  if (!secure_link_detail::certificate_names(cert.get(), id.task))
    return "the certificate does not name " + id.task;
  return "";
}

namespace issued_identity {
namespace {
std::mutex mu;
std::shared_ptr<const task_identity> current;
}  // namespace

void keep(task_identity id) {
  auto held = std::make_shared<const task_identity>(std::move(id));
  std::lock_guard<std::mutex> g(mu);
  current = std::move(held);
}

std::shared_ptr<const task_identity> held() {
  std::lock_guard<std::mutex> g(mu);
  return current;
}

void forget() {
  std::lock_guard<std::mutex> g(mu);
  current.reset();
}
}  // namespace issued_identity

}  // namespace troupe
