// Package dhchap is NVMe in-band authentication with DH-HMAC-CHAP (NVMe
// base specification 2.0, from TP 8006), independent of any transport: the
// secrets and their textual form (Secret), the messages carried by the
// Fabrics Authentication Send and Receive commands (one file per message
// family: negotiate, challenge, reply, success, failure), the computations
// (responses, the transformation of a secret, the augmented challenge),
// the DH groups, and a controller-side (Controller) and a host-side (Host)
// state machine.
//
// A transaction: the host sends AUTH_Negotiate (hash functions and DH
// groups it accepts); the controller answers DH-HMAC-CHAP_Challenge (its
// choice, a random challenge C1 with sequence number S1, and its DH public
// value); the host sends DH-HMAC-CHAP_Reply with R1 = HMAC(Kh, C1 || S1 ||
// T_ID || SC_C || "HostHost" || NQNh || 0 || NQNc), where Kh is the host's
// secret transformed with its NQN and C1 is first augmented with the DH
// session key when a group is used; for a bidirectional authentication it
// adds its own challenge C2. The controller answers DH-HMAC-CHAP_Success1
// (with R2, over C2 and the controller secret, when asked) or
// AUTH_Failure1; a bidirectional host ends with DH-HMAC-CHAP_Success2 or
// AUTH_Failure2. The byte layouts and computations follow what the Linux
// host and target (drivers/nvme/host/auth.c, drivers/nvme/target/auth.c
// and fabrics-cmd-auth.c, drivers/nvme/common/auth.c) put on the wire;
// kat_test.go holds known answers computed independently.
//
// Secure channel concatenation (SC_C other than 0, which derives a TLS PSK)
// is not supported: a controller refuses it with "secure channel
// concatenation mismatch". Without TLS nothing is encrypted: authentication
// proves who is at the other end of each queue when it is set up, it does
// not protect the traffic that follows (docs/reliability.md, security).
//
// DH arithmetic: the RFC 7919 groups ffdhe2048..ffdhe8192 (and the null
// group) are computed with filippo.io/bigmod, the constant-time modular
// arithmetic of Go's own crypto/rsa and crypto/ecdsa, published by its
// author as a module. Go's standard library has no finite field DH, and
// math/big's Exp takes time that depends on the exponent (its
// documentation says it is not for cryptography); golang.org/x/crypto has
// no FFDHE either. Private exponents have the short lengths RFC 7919 §5.2
// gives for each group's strength (225 to 400 bits); a peer's public value
// must lie in (1, p-1). One exponentiation (go test -bench on this 2-vCPU
// machine, ten runs each) takes 0.70 ms in ffdhe2048 (math/big: 0.75 ms),
// 18.8 ms in ffdhe4096 (math/big: 2.1 ms) and 86 ms in ffdhe8192 (math/big:
// 32 ms): bigmod has assembly for moduli up to 2048 bits only. Constant time
// was kept over math/big's speed for the larger groups; a controller
// prefers ffdhe2048 and draws its key once per queue and group, so a
// transaction costs it one exponentiation more (BenchmarkTransaction: one
// bidirectional transaction, both sides, 2.4 ms in ffdhe2048, 55 ms in
// ffdhe4096, 0.36 s in ffdhe8192, 0.14 ms with the null group).
//
// Secrets never print: Secret's String, Format and LogValue show only
// "DHHC-1:hh:<redacted>".
package dhchap
