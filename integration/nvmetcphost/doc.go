// Package nvmetcphost holds the guest tests of the initiator's NVMe/TCP
// host against the Linux kernel's NVMe/TCP target (nvmet-tcp), run in the
// guest lab (package lab): nprdma-initiator --transport tcp discovers and
// attaches a namespace the kernel serves, and fio verifies data through the
// attachment's NBD socket. The package has no code of its own.
package nvmetcphost
