// Package dhchapguest holds the guest-lab tests of in-band authentication
// (DH-HMAC-CHAP) against the Linux kernel: the kernel's NVMe/TCP host with
// --dhchap-secret and --dhchap-ctrl-secret against nprdma-target, and
// nprdma-initiator against the kernel's nvmet with a configured dhchap key.
// They need the guest lab (package lab) and the NVMe/TCP binding on both
// sides (nprdma-target --listen-nvme-tcp, nprdma-initiator --transport
// tcp), so their file carries //go:build ignore until those are part of the
// module; the protocol's own tests run everywhere (nvme/dhchap,
// target, initiator, cmd/nprdma-target).
package dhchapguest
