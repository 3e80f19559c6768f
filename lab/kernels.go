package lab

import (
	"fmt"
	"sort"
	"strings"
)

// A pinned guest kernel: the Debian packages that hold its image and its
// modules, each by exact version and SHA-256, and the suite they come
// from. Bumping a kernel is editing this table (docs/lab.md says how to
// find the next version and its checksums); the cache is keyed by Release
// and Version, so a bumped kernel is fetched beside the old one.
type kernel struct {
	Name    string // what Spec.Kernel says: "6.12", "7.3"
	Release string // uname -r in the guest; the directory under lib/modules
	// Archive is the repository the suite lives in: "debian" or
	// "debian-security". The mirror is the one the machine's own apt
	// sources name for that archive (deb.debian.org when none does).
	Archive  string
	Suite    string
	Packages []debPackage
	// Root is where the packages put lib/modules and the image, inside
	// the unpacked tree: "" (lib/modules, boot/) or "usr" (usr/lib/modules,
	// the image beside the modules).
	Root   string
	Image  string // the kernel image, relative to the unpacked tree
	Config string // the kernel's configuration, relative to the unpacked tree
}

type debPackage struct {
	Name, Version, SHA256 string
}

// The default kernel has every module the NVMe/TCP, NVMe/RDMA, NBD and ublk
// tests need except Soft-RoCE on-demand paging; 7.3 adds it.
const defaultKernel = "6.12"

var kernels = map[string]kernel{
	"6.12": {
		Name:    "6.12",
		Release: "6.12.117+deb12-amd64",
		Archive: "debian-security",
		Suite:   "bookworm-security",
		Packages: []debPackage{
			{"linux-image-6.12.117+deb12-amd64", "6.12.117-1~deb12u1", "803d36a7cda13355ae8152122470288b2636f19f1cb58162dd9d8b408af9b1b4"},
		},
		Image:  "boot/vmlinuz-6.12.117+deb12-amd64",
		Config: "boot/config-6.12.117+deb12-amd64",
	},
	"7.3": {
		Name:    "7.3",
		Release: "7.3.4+deb13-amd64",
		Archive: "debian",
		Suite:   "trixie-backports",
		Packages: []debPackage{
			{"linux-binary-7.3.4+deb13-amd64", "7.3.4-1~bpo13+1", "7e3248d03a84dcdda88c567aa8c4038f2e7795d2dd167b112c56f8901b6f513f"},
			{"linux-modules-7.3.4+deb13-amd64", "7.3.4-1~bpo13+1", "b3ea01922c9f133767a83cf6891c19b3693858ded617bf22d1e34f95382c08ea"},
			// modules.builtin, modules.order and the config live here.
			{"linux-base-7.3.4+deb13-amd64", "7.3.4-1~bpo13+1", "5663505495b5c90be94af42105c7b28629802516779102dac48d5a00cc00fccf"},
		},
		Root:   "usr",
		Image:  "usr/lib/modules/7.3.4+deb13-amd64/vmlinuz",
		Config: "usr/lib/modules/7.3.4+deb13-amd64/config",
	},
}

// lookupKernel returns the pinned kernel a Spec names ("" is the default).
func lookupKernel(name string) (kernel, error) {
	if name == "" {
		name = defaultKernel
	}
	k, ok := kernels[name]
	if !ok {
		return kernel{}, fmt.Errorf("lab: unknown kernel %q (pinned: %s)", name, strings.Join(KernelNames(), ", "))
	}
	return k, nil
}

// KernelNames lists the pinned kernels Spec.Kernel may name, default first.
func KernelNames() []string {
	names := make([]string, 0, len(kernels))
	for n := range kernels {
		if n != defaultKernel {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return append([]string{defaultKernel}, names...)
}

// cacheLayout changes whenever fetch prepares a tree differently (the
// modules decompressed, say), so that no tree of another layout is used.
const cacheLayout = "1"

// cacheName is the kernel's directory in the cache: a bumped package
// version or cache layout is a different directory.
func (k kernel) cacheName() string {
	return k.Release + "_" + k.Packages[0].Version + "_layout" + cacheLayout
}

// modulesDir is lib/modules/<release> relative to the unpacked tree.
func (k kernel) modulesDir() string {
	if k.Root == "" {
		return "lib/modules/" + k.Release
	}
	return k.Root + "/lib/modules/" + k.Release
}
