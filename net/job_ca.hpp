#pragma once
// The job's own certificate authority (cluster.identity "job_ca", the
// default): per-task identity without a PKI of the user's.
//
// Why: with the shared secret alone, the gate's proof and the TLS link's
// pre-shared key (net/gate.hpp, net/secure_link.hpp) can be made by
// any holder of the secret for any task name. So the chief's rendezvous
// (net/rendezvous.hpp) makes a fresh CA key pair in memory when it
// starts; each rank, once past the gate with the secret, sends the public
// half of a key pair it made itself (the private key never leaves the task)
// with a signature proving it holds the private half, and gets back a
// certificate naming its task (CN, e.g. "worker:0") signed by the job CA,
// with the CA's certificate. A rank is issued one only while no live
// connection holds that rank (a second claimant is refused and logged); a
// restarted process, the old one gone, gets a new one. The CA's private key
// lives only in the chief's rendezvous and is freed when it ends: after the
// cluster formed nobody is issued anything. The links between tasks then
// check certificates as cluster.tls does: a holder of the secret alone
// cannot speak as a task.
//
// Keys and signatures are Ed25519 (RFC 8032; TLS 1.3's ed25519 scheme).
#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

namespace troupe {

// A request or certificate that cannot be made or checked; what() says why.
class job_ca_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A task's identity in memory: what its links present and trust.
struct task_identity {
  std::string task;      // the name its certificate bears, e.g. "worker:0"
  std::string ca_pem;    // the job CA's certificate
  std::string cert_pem;  // the task's own, signed by the job CA
  std::string key_pem;   // the task's private key (PKCS#8 PEM), made here
};

// A key pair made where it is used (a rank, or the chief for itself).
class task_key {
 public:
  static constexpr std::size_t kPublicBytes = 32;
  static constexpr std::size_t kSignatureBytes = 64;
  task_key();  // a fresh Ed25519 key pair; throws job_ca_error
  ~task_key();
  task_key(const task_key&) = delete;
  task_key& operator=(const task_key&) = delete;
  std::string public_raw() const;  // kPublicBytes
  std::string private_pem() const;
  // The proof of possession for a certificate request: an Ed25519 signature
  // over `request` (kSignatureBytes).
  std::string sign_request(std::string_view request) const;

 private:
  struct state;
  std::unique_ptr<state> st_;
};

// The chief's CA for one job: made at the rendezvous, never written anywhere.
class job_authority {
 public:
  job_authority();  // throws job_ca_error
  ~job_authority();
  job_authority(const job_authority&) = delete;
  job_authority& operator=(const job_authority&) = delete;
  const std::string& ca_pem() const;
  // A certificate (PEM) naming `task` for the Ed25519 key `public_raw`, once
  // `signature` proves its holder signed `request` with it; throws
  // job_ca_error naming what is wrong.
  std::string issue(const std::string& task, std::string_view public_raw, std::string_view request,
                    std::string_view signature) const;
  // The chief's own identity as `task`: a key made here, a certificate for it.
  task_identity issue_self(const std::string& task) const;

 private:
  struct state;
  std::unique_ptr<state> st_;
};

// Whether `id` is whole: its certificate names id.task, is signed by id.ca_pem
// and carries the public half of id.key_pem. "" or why not.
std::string check_task_identity(const task_identity& id);

// The identity this process was issued at the rendezvous, kept for its
// node's links (net/secure_link.hpp); one per process.
namespace issued_identity {
void keep(task_identity id);
std::shared_ptr<const task_identity> held();  // null: none issued
void forget();
}  // namespace issued_identity

}  // namespace troupe
