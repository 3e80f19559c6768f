// Package lab is the guest lab: it boots a pinned Debian kernel under QEMU
// (TCG), runs a bash script in the guest as root and returns its exit
// status, output and steps. It exists because this machine's kernel has no
// NVMe/TCP, nvmet, RDMA, NBD or ublk and cannot load modules; the guest's
// kernel has them all. docs/lab.md describes it for people.
//
// # The guest
//
//   - This machine's root file system is shared read-only over 9p under a
//     writable tmpfs overlay: every tool and binary here (a test binary from
//     `go test -c`, bin/nprdma-target, nvme-cli, fio) runs in the guest at
//     the same path, and what the guest writes stays in the guest. The lab
//     copies nothing. A binary run often is best copied to /dev/shm first.
//   - $LAB_OUT is a directory shared with this machine (Result.Dir, the same
//     path on both sides); scripts start in it. Large scratch files (an
//     nvmet backing file) belong in /dev/shm: the kernel's nvmet does not
//     take files on the overlay.
//   - eth0 is 10.0.2.15/24 on QEMU's user network, restricted: the guest
//     reaches nothing beyond itself (not even this machine through the
//     gateway 10.0.2.2). This machine reaches the guest only through
//     Spec.Forward ports, bound to 127.0.0.1.
//   - Modules: busybox modprobe over the cached module tree (bound at
//     /lib/modules); /proc/sys/kernel/modprobe names it, so the kernel loads
//     what it needs itself. configfs, devpts, /dev/shm are mounted. The
//     kernel's configuration is at /boot/config-$(uname -r).
//
// # Scripts and steps
//
// Scripts run under bash `set -eEo pipefail` with a library sourced
// (guest/lib.sh):
//
//	step NAME                        the previous step ended well; NAME starts
//	nvmet_export NQN PATH [TRTYPE [TRADDR [TRSVCID]]]
//	                                 the kernel's NVMe target serves PATH as
//	                                 namespace 1 of NQN (tcp 127.0.0.1 4420; rdma after rxe_up)
//	nvmet_clear                      removes every nvmet port and subsystem
//	nvme_ns_dev NQN [NSID]           waits for the kernel host's namespace, prints /dev/nvmeXnY
//	rxe_up [NETDEV]                  Soft-RoCE device rxe0 on eth0 (use 10.0.2.15 for rdma_cm)
//
// The step running when a command fails is Result.FailedStep; the output
// names the failing command and its line. Spec.Modules are loaded first,
// each as a step "modprobe NAME".
//
// # Guest tests
//
// A guest test is a Go test named TestGuest... in any package, which calls
// RunT (or Require, then Run). `make unit` skips tests of that name and
// `make guest-test` (part of `make test`) runs them, in every package, when
// the lab can run here (see Available); elsewhere they skip with the reason.
// Nothing is registered: naming the test is enough. Keep both ends of any
// traffic inside the guest, or cross only through Spec.Forward. Figures
// measured in the guest run under TCG: report only ratios between things
// measured in the same guest, labelled so.
//
// # Kernels and the cache
//
// Spec.Kernel "6.12" (the default, bookworm-security) or "7.3"
// (trixie-backports; adds rxe on-demand paging): pinned by package version
// and SHA-256 in kernels.go. They are fetched with a private apt
// configuration (own sources list and state under the cache; the machine's
// apt is untouched) by Fetch, which `make deps` calls (nprdma-lab fetch)
// and Available calls when a kernel is missing; they are unpacked, their
// modules decompressed and indexed, under CacheDir (default
// /tmp/nprdma-lab, shared by every checkout) behind a file lock, and
// renamed into place only once complete.
//
// # Runs
//
// Each Run has its own temporary directories (the lab's files and
// $LAB_OUT) and no fixed port or file name, so runs may overlap freely,
// from one process or several. QEMU is started by the lab with a
// parent-death signal and killed by its PID before Run returns, on every
// path: script end, Spec.Timeout, ctx cancelled, panic; if the process
// dies (a test binary's -timeout), the kernel kills QEMU.
//
// # Beyond LAB-API.md
//
// The API the other packages were written against, plus: Run also returns
// a partial Result with its error when the script had started (timeout,
// guest crash), naming the running step; ErrTimeout; Result.Boot (time to
// a booted guest); RequireKernel (Require for "7.3"); RunT skips when
// Spec.Kernel is unavailable; FreePort (a HostPort for Forward); Shell (the
// interactive guest of `make lab`); Fetch, CacheDir, KernelNames, and the
// Default* constants.
package lab
