package nvme

import (
	"encoding/binary"
	"testing"
)

func sampleRegion() RegionDescriptor {
	return RegionDescriptor{
		Format: RegionDescriptorFormat1, Flags: RegionRemoteRead | RegionUnpinned | RegionAdvise,
		PageSize: 4096, Address: 0x7f00_0000_0000, Length: 1 << 30, RKey: 0xa1b2c3d4,
		LBASize: 4096, Magic: 0x5eed_f00d_dead_beef,
	}
}

func TestRegionDescriptorLayout(t *testing.T) {
	d := sampleRegion()
	b, err := d.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	u16 := func(o int) uint64 { return uint64(binary.LittleEndian.Uint16(b[o:])) }
	u32 := func(o int) uint64 { return uint64(binary.LittleEndian.Uint32(b[o:])) }
	u64 := func(o int) uint64 { return binary.LittleEndian.Uint64(b[o:]) }
	checks := []struct {
		field     string
		got, want uint64
	}{
		{"Format @0", u16(0), 1},
		{"Flags @2", u16(2), 7},
		{"PageSize @4", u32(4), 4096},
		{"Address @8", u64(8), 0x7f00_0000_0000},
		{"Length @16", u64(16), 1 << 30},
		{"RKey @24", u32(24), 0xa1b2c3d4},
		{"LBASize @28", u32(28), 4096},
		{"Magic @32", u64(32), 0x5eed_f00d_dead_beef},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = 0x%x, want 0x%x", c.field, c.got, c.want)
		}
	}
	if len(b) != 64 || !isZero(b[40:]) {
		t.Errorf("reserved bytes: % x", b[40:])
	}
	back, err := ParseRegionDescriptor(b)
	if err != nil || back != d {
		t.Fatalf("round trip %+v %v", back, err)
	}
	if back.Blocks() != 1<<18 {
		t.Errorf("Blocks %d", back.Blocks())
	}
	if a, ok := back.BlockAddress(3); !ok || a != 0x7f00_0000_3000 {
		t.Errorf("BlockAddress(3) = 0x%x %v", a, ok)
	}
	if _, ok := back.BlockAddress(1 << 18); ok {
		t.Error("BlockAddress beyond the end")
	}
}

func TestRegionDescriptorRejects(t *testing.T) {
	mutate := map[string]func(*RegionDescriptor){
		"format 2":          func(d *RegionDescriptor) { d.Format = 2 },
		"page size 3000":    func(d *RegionDescriptor) { d.PageSize = 3000 },
		"page size 256":     func(d *RegionDescriptor) { d.PageSize = 256 },
		"LBA size 0":        func(d *RegionDescriptor) { d.LBASize = 0 },
		"LBA size 520":      func(d *RegionDescriptor) { d.LBASize = 520 },
		"length 0":          func(d *RegionDescriptor) { d.Length = 0 },
		"length not blocks": func(d *RegionDescriptor) { d.Length = 4097 },
		"wraps":             func(d *RegionDescriptor) { d.Address = ^uint64(0) - 4095 },
		"magic 0":           func(d *RegionDescriptor) { d.Magic = 0 },
	}
	sample := sampleRegion()
	good, _ := sample.Marshal()
	for name, m := range mutate {
		d := sampleRegion()
		m(&d)
		if _, err := d.Marshal(); err == nil {
			t.Errorf("%s: marshalled", name)
		}
		b := append([]byte(nil), good...)
		binary.LittleEndian.PutUint16(b[0:], d.Format)
		binary.LittleEndian.PutUint32(b[4:], d.PageSize)
		binary.LittleEndian.PutUint64(b[8:], d.Address)
		binary.LittleEndian.PutUint64(b[16:], d.Length)
		binary.LittleEndian.PutUint32(b[28:], d.LBASize)
		binary.LittleEndian.PutUint64(b[32:], d.Magic)
		if _, err := ParseRegionDescriptor(b); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
	if _, err := ParseRegionDescriptor(good[:63]); err == nil {
		t.Error("63 bytes parsed")
	}
}

func TestNPCommands(t *testing.T) {
	sgl, _ := KeyedSGL(0x1000, RegionDescriptorSize, 3)
	g := NPGetRegionDescriptorCommand(7, sgl)
	if g.Opcode != 0xc2 || g.Opcode.Direction() != ControllerToHost || g.NSID != 7 || g.RegionDescriptorFormat() != RegionDescriptorFormat2 {
		t.Fatalf("get region descriptor %+v", g)
	}
	if g.Name(true) != "np-get-region-descriptor" {
		t.Errorf("name %q", g.Name(true))
	}
	for _, f := range []uint32{1, 2} {
		g.CDW10 = f
		if err := g.CheckNPGetRegionDescriptor(); err != nil {
			t.Errorf("format %d: %v", f, err)
		}
	}
	g.CDW10 = 3
	if err := g.CheckNPGetRegionDescriptor(); StatusOf(err) != StatusInvalidField.WithDNR() {
		t.Errorf("format 3: %v", err)
	}
	g.CDW10 = 1
	g.DPTR, _ = KeyedSGL(0x1000, 4096, 3)
	if err := g.CheckNPGetRegionDescriptor(); StatusOf(err) != StatusDataSGLLengthInvalid.WithDNR() {
		t.Errorf("4096-byte buffer: %v", err)
	}

	a, err := NPAdviseCommand(7, 0x1_0000_0000, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if a.Opcode != 0x80 || a.Direction() != NoData || a.CDW10 != 0 || a.CDW11 != 1 || a.CDW12 != 1<<20-1 {
		t.Fatalf("advise %+v", a)
	}
	p := a.BlockIO()
	if p.SLBA != 0x1_0000_0000 || p.Blocks() != 1<<20 || p.FUA {
		t.Errorf("advise params %+v", p)
	}
	if a.Name(false) != "np-advise" {
		t.Errorf("name %q", a.Name(false))
	}
	max, err := NPAdviseCommand(1, 0, MaxAdviseBlocks)
	if err != nil || max.BlockIO().Blocks() != 1<<32 {
		t.Errorf("max advise: %v", err)
	}
	for _, n := range []uint64{0, MaxAdviseBlocks + 1} {
		if _, err := NPAdviseCommand(1, 0, n); err == nil {
			t.Errorf("advise of %d blocks accepted", n)
		}
	}
}

func TestNPInstanceRestartedSince(t *testing.T) {
	tracked := func(boot, unclean uint64) NPInstance {
		return NPInstance{BootID: boot, UncleanStarts: unclean, Flags: NPInstanceTracked}
	}
	for _, c := range []struct {
		name                   string
		prev, now              NPInstance
		restarted, mayHaveLost bool
	}{
		{"same process", tracked(7, 2), tracked(7, 2), false, false},
		{"clean restart", tracked(7, 2), tracked(8, 2), true, false},
		{"restart after a crash", tracked(7, 2), tracked(8, 3), true, true},
		{"untracked restart", NPInstance{BootID: 7}, NPInstance{BootID: 8}, true, true},
		{"tracking lost", tracked(7, 2), NPInstance{BootID: 8, UncleanStarts: 2}, true, true},
		{"not reported before", NPInstance{}, tracked(8, 3), false, false},
		{"not reported now", tracked(7, 2), NPInstance{}, false, false},
	} {
		restarted, lost := c.now.RestartedSince(c.prev)
		if restarted != c.restarted || lost != c.mayHaveLost {
			t.Errorf("%s: restarted %v, may have lost %v; want %v, %v", c.name, restarted, lost, c.restarted, c.mayHaveLost)
		}
	}
}
