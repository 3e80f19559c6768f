// Package attachguest holds the guest tests of nprdma-initiator's kernel
// block-device attach modes, ublk and nbd-kernel, which need a kernel with
// ublk_drv and nbd: run in the guest lab (package lab), with the target and
// the initiator both in the guest. The package has no code of its own.
package attachguest
