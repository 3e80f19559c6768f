// Package dhchapguest holds the guest-lab tests of in-band authentication
// (DH-HMAC-CHAP) against the Linux kernel: the kernel's NVMe/TCP host with
// --dhchap-secret and --dhchap-ctrl-secret against nprdma-target, and
// nprdma-initiator against the kernel's nvmet with a configured dhchap key.
// They run in the guest lab (`make guest-test`), over NVMe/TCP on both
// sides (nprdma-target --listen-nvme-tcp, nprdma-initiator --transport
// tcp); the protocol's own tests run everywhere (nvme/dhchap, target,
// initiator, cmd/nprdma-target). The package has no code of its own.
package dhchapguest
