// OpenSSL's side of the TLS links (net/secure_link_detail.hpp): the
// contexts, the pre-shared key and certificate callbacks, and the key log
// that hands a link its traffic secrets.
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <memory>
#include <string>
#include <string_view>

#include "crypto/crypto.hpp"
#include "net/job_ca.hpp"
#include "net/secure_link_detail.hpp"

namespace troupe::secure_link_detail {

std::string ssl_errors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "no OpenSSL error recorded" : out;
}

namespace {

link* link_of(SSL* ssl) {
  return static_cast<link*>(SSL_get_app_data(ssl));
}

// A TLS 1.3 session carrying an external PSK (the way OpenSSL takes one).
SSL_SESSION* psk_session(SSL* ssl, const std::string& key) {
  static const unsigned char aes128gcm_sha256[] = {0x13, 0x01};
  const SSL_CIPHER* cipher = SSL_CIPHER_find(ssl, aes128gcm_sha256);
  SSL_SESSION* s = cipher ? SSL_SESSION_new() : nullptr;
  if (!s) return nullptr;
  if (!SSL_SESSION_set1_master_key(s, reinterpret_cast<const unsigned char*>(key.data()),
                                   key.size()) ||
      !SSL_SESSION_set_cipher(s, cipher) || !SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION)) {
    SSL_SESSION_free(s);
    return nullptr;
  }
  return s;
}

// The connector offers its link's key under its own task's name.
int use_psk(SSL* ssl, const EVP_MD* md, const unsigned char** id, size_t* id_len,
            SSL_SESSION** session) {
  *session = nullptr;
  auto* l = link_of(ssl);
  if (!l) return 0;
  SSL_SESSION* s = psk_session(ssl, l->psk);
  if (!s) return 0;
  if (md && md != SSL_CIPHER_get_handshake_digest(SSL_SESSION_get0_cipher(s))) {
    SSL_SESSION_free(s);  // a hash this key is not for: offer nothing
    return 1;
  }
  *id = reinterpret_cast<const unsigned char*>(l->p.me.data());
  *id_len = l->p.me.size();
  *session = s;
  return 1;
}

// The listener finds the key only for the task its gate admitted.
int find_psk(SSL* ssl, const unsigned char* id, size_t id_len, SSL_SESSION** session) {
  *session = nullptr;
  auto* l = link_of(ssl);
  if (!l) return 0;
  std::string identity(reinterpret_cast<const char*>(id), id_len);
  if (identity != l->p.peer_task) {
    l->psk_problem =
        "its TLS identity '" + identity.substr(0, 64) + "' is not the task that passed the gate";
    return 1;  // no key: the handshake fails
  }
  *session = psk_session(ssl, l->psk);
  return *session ? 1 : 0;
}

}  // namespace

// Whether `cert` names `task`: subject CN, or a DNS or URI alternative name.
bool certificate_names(X509* cert, const std::string& task) {
  char cn[256] = {};
  int n = X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof cn);
  if (n > 0 && std::string(cn, static_cast<std::size_t>(n)) == task) return true;
  auto* names =
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  bool found = false;
  for (int i = 0; names && i < sk_GENERAL_NAME_num(names) && !found; ++i) {
    const GENERAL_NAME* g = sk_GENERAL_NAME_value(names, i);
    const ASN1_IA5STRING* s = g->type == GEN_DNS   ? g->d.dNSName
                              : g->type == GEN_URI ? g->d.uniformResourceIdentifier
                                                   : nullptr;
    if (s)
      found = std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                          static_cast<std::size_t>(ASN1_STRING_length(s))) == task;
  }
  GENERAL_NAMES_free(names);
  return found;
}

// OpenSSL hands every secret the handshake derives to its key log; a link
// keeps the two application traffic secrets (never written anywhere) to
// key its record layer.
void keep_traffic_secret(const SSL* ssl, const char* line) {
  // (Nothing here may throw: OpenSSL's C frames are below. The line is
  // OpenSSL's, wiped by it after this call: no copy of it is made.)
  auto* l = link_of(const_cast<SSL*>(ssl));
  if (!l) return;
  const std::string_view text(line);
  std::string* slot = nullptr;
  if (text.starts_with("CLIENT_TRAFFIC_SECRET_0 "))
    slot = &l->client_secret;
  else if (text.starts_with("SERVER_TRAFFIC_SECRET_0 "))
    slot = &l->server_secret;
  if (!slot) return;
  long len = 0;
  unsigned char* bytes = OPENSSL_hexstr2buf(line + text.rfind(' ') + 1, &len);
  crypto::cleanse(*slot);
  if (bytes) slot->assign(reinterpret_cast<const char*>(bytes), static_cast<std::size_t>(len));
  OPENSSL_clear_free(bytes, static_cast<std::size_t>(len));
}

namespace {

// The job CA's issue (net/job_ca.hpp), from memory: no file holds the key.
void use_identity(SSL_CTX* c, const task_identity& id) {
  const auto bad = [&id](const std::string& what) {
    return link_error(id.task + ": the job CA's " + what + ": " + ssl_errors());
  };
  auto read_bio = [](const std::string& pem) {
    return BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  };
  BIO* ca_bio = read_bio(id.ca_pem);
  X509* ca = ca_bio ? PEM_read_bio_X509(ca_bio, nullptr, nullptr, nullptr) : nullptr;
  BIO_free(ca_bio);
  const bool ca_ok = ca && X509_STORE_add_cert(SSL_CTX_get_cert_store(c), ca) == 1;
  X509_free(ca);
  if (!ca_ok) throw bad("certificate");
  BIO* cert_bio = read_bio(id.cert_pem);
  X509* cert = cert_bio ? PEM_read_bio_X509(cert_bio, nullptr, nullptr, nullptr) : nullptr;
  BIO_free(cert_bio);
  const bool cert_ok = cert && SSL_CTX_use_certificate(c, cert) == 1;
  X509_free(cert);
  if (!cert_ok) throw bad("certificate for this task");
  BIO* key_bio = read_bio(id.key_pem);
  EVP_PKEY* key = key_bio ? PEM_read_bio_PrivateKey(key_bio, nullptr, nullptr, nullptr) : nullptr;
  BIO_free(key_bio);
  const bool key_ok = key && SSL_CTX_use_PrivateKey(c, key) == 1;
  EVP_PKEY_free(key);
  if (!key_ok || SSL_CTX_check_private_key(c) != 1) throw bad("key of this task");
  SSL_CTX_set_verify(c, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
}

}  // namespace

ctx_ptr make_context(const link_security& sec) {
  ERR_clear_error();
  ctx_ptr ctx(SSL_CTX_new(TLS_method()));
  if (!ctx) throw link_error("TLS: cannot create a context: " + ssl_errors());
  SSL_CTX* c = ctx.get();
  SSL_CTX_set_min_proto_version(c, TLS1_3_VERSION);
  SSL_CTX_set_max_proto_version(c, TLS1_3_VERSION);
  // The record layer after the handshake is ours (net/tls_records.hpp),
  // for this suite: AES-GCM runs in hardware on every x86 CPU we target.
  SSL_CTX_set_ciphersuites(c, "TLS_AES_128_GCM_SHA256");
  // Nothing after the handshake: no tickets (a NewSessionTicket would be a
  // record of the application keys that OpenSSL, not our layer, sent).
  SSL_CTX_set_num_tickets(c, 0);
  SSL_CTX_set_options(c, SSL_OP_NO_TICKET);
  SSL_CTX_set_session_cache_mode(c, SSL_SESS_CACHE_OFF);
  // No read-ahead: OpenSSL reads the handshake record by record and stops
  // at its end, so the first application record is still in the socket
  // for our layer.
  SSL_CTX_set_read_ahead(c, 0);
  SSL_CTX_set_keylog_callback(c, keep_traffic_secret);
  if (sec.kind == link_security::trust::psk) {
    SSL_CTX_set_psk_use_session_callback(c, use_psk);
    SSL_CTX_set_psk_find_session_callback(c, find_psk);
    SSL_CTX_set_verify(c, SSL_VERIFY_NONE, nullptr);
    return ctx;
  }
  if (sec.identity) {
    use_identity(c, *sec.identity);
    return ctx;
  }
  auto bad = [](const char* key, const std::string& file) {
    return link_error("cluster.tls." + std::string(key) + " \"" + file + "\": " + ssl_errors());
  };
  if (SSL_CTX_load_verify_locations(c, sec.ca_file.c_str(), nullptr) != 1)
    throw bad("ca", sec.ca_file);
  if (SSL_CTX_use_certificate_chain_file(c, sec.cert_file.c_str()) != 1)
    throw bad("cert", sec.cert_file);
  if (SSL_CTX_use_PrivateKey_file(c, sec.key_file.c_str(), SSL_FILETYPE_PEM) != 1)
    throw bad("key", sec.key_file);
  if (SSL_CTX_check_private_key(c) != 1)
    throw link_error("cluster.tls.key \"" + sec.key_file + "\" does not match cluster.tls.cert \"" +
                     sec.cert_file + "\"");
  SSL_CTX_set_verify(c, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  return ctx;
}

std::string ca_certificates_digest(const link_security& sec) {
  std::string pem = sec.identity ? sec.identity->ca_pem : std::string();
  if (!sec.identity) {
    std::unique_ptr<BIO, decltype(&BIO_free)> file(BIO_new_file(sec.ca_file.c_str(), "r"),
                                                   BIO_free);
    if (!file)
      throw link_error("cluster.tls.ca \"" + sec.ca_file + "\": cannot read it: " + ssl_errors());
    char buf[4096];
    for (int n; (n = BIO_read(file.get(), buf, sizeof buf)) > 0;) {
      pem.append(buf, static_cast<std::size_t>(n));
      if (pem.size() > (std::size_t{1} << 20))
        throw link_error("cluster.tls.ca \"" + sec.ca_file + "\": over 1 MiB");
    }
  }
  // The certificates' DER bytes, not the file's text: the same CA gives the
  // same key however its PEM is wrapped or commented.
  std::unique_ptr<BIO, decltype(&BIO_free)> in(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), BIO_free);
  std::string der;
  while (X509* x = PEM_read_bio_X509(in.get(), nullptr, nullptr, nullptr)) {
    unsigned char* out = nullptr;
    const int n = i2d_X509(x, &out);
    if (n > 0) der.append(reinterpret_cast<const char*>(out), static_cast<std::size_t>(n));
    OPENSSL_free(out);
    X509_free(x);
  }
  ERR_clear_error();  // the end of the PEM stream
  if (der.empty())
    throw link_error(
        (sec.identity ? std::string("the job CA") : "cluster.tls.ca \"" + sec.ca_file + "\"") +
        ": no certificate in it");
  return crypto::to_hex(crypto::sha256(der));
}

std::string context_key(const link_security& sec) {
  if (sec.kind == link_security::trust::psk) return "psk";
  if (sec.identity) return "job CA" + std::string(1, '\0') + sec.identity->cert_pem;
  return sec.ca_file + '\0' + sec.cert_file + '\0' + sec.key_file;
}

}  // namespace troupe::secure_link_detail
