package lab

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// The first stage of the guest: a static busybox, the modules that mount
// the host's root (9p over virtio, overlay), and /init (guest/init), which
// builds the guest's root and hands over to guest/stage2.
var initramfsModules = []string{"9pnet_virtio", "9p", "overlay", "configfs", "virtio_net"}

// busyboxPath is the static busybox of Debian's busybox-static package.
const busyboxPath = "/bin/busybox"

// checkBusybox reports whether busyboxPath can run in an initramfs,
// without a C library: it must be statically linked.
func checkBusybox() error {
	f, err := elf.Open(busyboxPath)
	if err != nil {
		return fmt.Errorf("%s: %v (install busybox-static; make deps does)", busyboxPath, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked: the lab needs busybox-static", busyboxPath)
		}
	}
	return nil
}

// buildInitramfs returns the initramfs (an uncompressed newc cpio archive)
// for the kernel unpacked at tree.
func buildInitramfs(k kernel, tree string) ([]byte, error) {
	modDir := filepath.Join(tree, k.modulesDir())
	mods, err := moduleClosure(modDir, initramfsModules)
	if err != nil {
		return nil, err
	}
	bb, err := os.ReadFile(busyboxPath)
	if err != nil {
		return nil, err
	}
	init, err := guestFiles.ReadFile("guest/init")
	if err != nil {
		return nil, err
	}
	var a cpioWriter
	for _, d := range []string{"bin", "dev", "proc", "sys", "mod", "lower", "rw", "newroot"} {
		a.dir(d)
	}
	// The kernel opens /dev/console for init's standard streams before
	// devtmpfs is mounted.
	a.charDev("dev/console", 5, 1)
	a.file("bin/busybox", bb, 0o755)
	a.file("init", init, 0o755)
	var order strings.Builder
	for _, m := range mods {
		data, err := os.ReadFile(filepath.Join(modDir, m))
		if err != nil {
			return nil, err
		}
		name := path.Base(m)
		a.file("mod/"+name, data, 0o644)
		order.WriteString(name + "\n")
	}
	a.file("mod/order", []byte(order.String()), 0o644)
	return a.finish(), nil
}

// moduleClosure returns the modules.dep paths of names and of everything
// they depend on, each after its dependencies.
func moduleClosure(modDir string, names []string) ([]string, error) {
	f, err := os.Open(filepath.Join(modDir, "modules.dep"))
	if err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	defer f.Close()
	deps := map[string][]string{} // module path -> the paths it needs
	byName := map[string]string{} // module name -> path
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		p, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		deps[p] = strings.Fields(rest)
		byName[moduleName(p)] = p
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("lab: modules.dep: %w", err)
	}
	var out []string
	seen := map[string]bool{}
	var visit func(p string)
	visit = func(p string) {
		if seen[p] {
			return
		}
		seen[p] = true
		for _, d := range deps[p] {
			visit(d)
		}
		out = append(out, p)
	}
	for _, n := range names {
		p, ok := byName[moduleName(n)]
		if !ok {
			return nil, fmt.Errorf("lab: module %s is not in %s", n, filepath.Join(modDir, "modules.dep"))
		}
		visit(p)
	}
	return out, nil
}

// moduleName is a module's canonical name: no directory, no .ko[.xz|.zst|.gz],
// underscores for dashes.
func moduleName(p string) string {
	n := path.Base(p)
	if i := strings.Index(n, ".ko"); i >= 0 {
		n = n[:i]
	}
	return strings.ReplaceAll(n, "-", "_")
}

// cpioWriter writes the "newc" cpio format the kernel unpacks into its
// initramfs (Documentation/driver-api/early-userspace/buffer-format.rst).
type cpioWriter struct {
	buf bytes.Buffer
	ino int
}

func (w *cpioWriter) dir(name string) { w.entry(name, 0o040755, nil, 0, 0) }

func (w *cpioWriter) charDev(name string, major, minor int) {
	w.entry(name, 0o020600, nil, major, minor)
}

func (w *cpioWriter) file(name string, data []byte, perm int) {
	w.entry(name, 0o100000|perm, data, 0, 0)
}

func (w *cpioWriter) entry(name string, mode int, data []byte, rmajor, rminor int) {
	w.ino++
	nlink := 1
	if mode&0o170000 == 0o040000 {
		nlink = 2
	}
	fmt.Fprintf(&w.buf, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		w.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rmajor, rminor, len(name)+1, 0)
	w.buf.WriteString(name)
	w.buf.WriteByte(0)
	w.pad()
	w.buf.Write(data)
	w.pad()
}

func (w *cpioWriter) pad() {
	for w.buf.Len()%4 != 0 {
		w.buf.WriteByte(0)
	}
}

func (w *cpioWriter) finish() []byte {
	w.entry("TRAILER!!!", 0, nil, 0, 0)
	return w.buf.Bytes()
}
