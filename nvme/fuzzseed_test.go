package nvme

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// Seeds shared by f.Add and the committed corpus files.

type capsuleSeed struct {
	capsule []byte
	maxICD  uint16
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func capsuleSeeds() []capsuleSeed {
	keyed := must(KeyedSGLInvalidate(0x7f0012340000, 8192, 0x1234))
	read := must(ReadCommand(1, 16, 2, 0, keyed))
	write := must(WriteCommand(1, 16, 1, FUA, InCapsuleSGL(0, 4096)))
	id := IdentifyCommand(CNSController, 0, must(KeyedSGL(0x1000, 4096, 9)))
	connData := must((&ConnectData{HostID: UUID{1}, CNTLID: DynamicControllerID,
		SubNQN: "nqn.2024-01.io.nprdma:disk", HostNQN: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001"}).Marshal())
	conn := ConnectCommand(ConnectParams{QID: 1, SQSIZE: 127}, InCapsuleSGL(0, ConnectDataSize))
	dsm := must(DeallocateCommand(1, 2, InCapsuleSGL(0, 32)))
	ranges := must(MarshalDSMRanges([]DSMRange{{Blocks: 8, SLBA: 0}, {Blocks: 1, SLBA: 100}}))
	prop := must(PropertySetCommand(PropCC, 4, 0x460001))
	bad := read
	bad.DPTR[15] = 0x30
	return []capsuleSeed{
		{read.Marshal(), 0},
		{MarshalCapsule(&write, make([]byte, 4096)), 4096},
		{id.Marshal(), 0},
		{MarshalCapsule(&conn, connData), 8192},
		{MarshalCapsule(&dsm, ranges), 4096},
		{prop.Marshal(), 0},
		{bad.Marshal(), 0},
		{read.Marshal()[:40], 0},
	}
}

func completionSeeds() [][]byte {
	ok := Completion{DW0: 0x0001, SQHD: 1, CID: 7}
	bad := Completion{CID: 8, SQID: 1, Status: StatusLBAOutOfRange.WithDNR(), Phase: true}
	inv := Completion{DW0: InvalidParameter{InData: true, Offset: 256}.DW0(), Status: StatusConnectInvalidParameters.WithDNR()}
	return [][]byte{ok.Marshal(), bad.Marshal(), inv.Marshal()}
}

func connectDataSeeds() [][]byte {
	d := ConnectData{HostID: UUID{0: 0x11, 15: 0x22}, CNTLID: 1, SubNQN: "nqn.2024-01.io.nprdma:disk", HostNQN: HostNQNFromUUID(UUID{2})}
	b := must(d.Marshal())
	full := bytes.Clone(b)
	copy(full[256:768], bytes.Repeat([]byte{'n'}, 512))
	d.Replaces = NPControllerRef{Token: 0x8877665544332211, CNTLID: 3}
	return [][]byte{b, full, b[:100], must(d.Marshal())}
}

func cmSeeds() [][]byte {
	req := CMRequest{QID: 1, HRQSIZE: 128, HSQSIZE: 127}
	acc := CMAccept{CRQSIZE: 128}
	rej := CMReject{Status: CMRejectNoResources}
	return [][]byte{req.Marshal(), acc.Marshal(), rej.Marshal(), append(req.Marshal(), make([]byte, 24)...)}
}

func identifySeeds() [][]byte {
	ctrl := sampleController()
	ns := IdentifyNamespace{NSZE: 1 << 20, NCAP: 1 << 20, NUSE: 1 << 10, DLFEAT: DLFEATReadZeroes, NGUID: [16]byte{1}}
	ns.LBAF[0] = LBAFormat{LBADS: 12}
	ids := NamespaceIDs{NGUID: [16]byte{1}, UUID: UUID{2}}
	return [][]byte{
		must(ctrl.Marshal()),
		must(ns.Marshal()),
		ActiveNamespaceList([]uint32{1, 2, 5}, 0),
		must(ids.Marshal()),
	}
}

func logSeeds() [][]byte {
	h := NewHealthLog()
	fw := FirmwareSlotLog{ActiveSlot: 1, Revisions: [7]string{"0.1"}}
	var fx CommandEffectsLog
	fx.IO[IORead] = EffectSupported
	return [][]byte{
		MarshalErrorLog([]ErrorLogEntry{{ErrorCount: 1, Status: StatusInvalidField.WithDNR()}}),
		h.Marshal(),
		must(fw.Marshal()),
		fx.Marshal(),
		MarshalChangedNamespaceList([]uint32{1, 7, 0xfffffffe}),
		MarshalChangedNamespaceList(make([]uint32, 2000)),
	}
}

func regionSeeds() [][]byte {
	d := sampleRegion()
	small := RegionDescriptor{Format: 1, PageSize: 4096, Address: 0, Length: 512, LBASize: 512, Magic: 1}
	f := RegionDescriptor{Format: RegionDescriptorFormat2, Flags: RegionRemoteRead, PageSize: 4096, Address: 1 << 20,
		Length: 1 << 30, RKey: 9, LBASize: 4096, TableAddress: 1 << 40, Frames: 64, Buckets: 16, Seed: 5, FrameSize: FrameHeaderSize + 4096}
	return [][]byte{must(d.Marshal()), must(small.Marshal()), must(f.Marshal())}
}

// frameSeeds are a seed and a frame of block seed%64 (see FuzzFrame): a
// stable one, one being changed, an empty one.
func frameSeeds() [][]byte {
	frame := func(seed uint64, v uint64, tag bool) []byte {
		b := make([]byte, 8+FrameHeaderSize+512)
		le.PutUint64(b, seed)
		block := uint64(byte(seed)) % 64
		fr := b[8:]
		for i := range fr[FrameHeaderSize:] {
			fr[FrameHeaderSize+i] = byte(i)
		}
		if tag {
			le.PutUint64(fr[FrameTagOffset:], block+1)
		}
		le.PutUint64(fr[FrameVersionOffset:], v)
		le.PutUint64(fr[FrameSumOffset:], FrameChecksum(seed, block, v, fr[FrameHeaderSize:]))
		return b
	}
	return [][]byte{frame(0x1234, 8, true), frame(0x99, 9, true), frame(7, 2, false)}
}

type dsmSeed struct {
	data []byte
	nr   uint8
}

func dsmSeeds() []dsmSeed {
	one := must(MarshalDSMRanges([]DSMRange{{Blocks: 8, SLBA: 0}}))
	two := must(MarshalDSMRanges([]DSMRange{{Attributes: 1, Blocks: 1 << 31, SLBA: 1 << 40}, {Blocks: 0, SLBA: 5}}))
	return []dsmSeed{{one, 0}, {two, 1}, {one, 3}}
}

func corpusValue(v any) string {
	switch x := v.(type) {
	case []byte:
		return fmt.Sprintf("[]byte(%q)", x)
	case uint16:
		return fmt.Sprintf("uint16(%d)", x)
	case uint8:
		return fmt.Sprintf("byte(%q)", rune(x))
	}
	panic(fmt.Sprintf("corpusValue: %T", v))
}

// TestWriteFuzzSeeds writes the seed corpora in the "go test fuzz v1" format
// when NPRDMA_WRITE_FUZZ_SEEDS=1; otherwise it checks that every fuzz target
// has a committed corpus.
func TestWriteFuzzSeeds(t *testing.T) {
	corpora := map[string][][]any{}
	for _, s := range capsuleSeeds() {
		corpora["FuzzCapsule"] = append(corpora["FuzzCapsule"], []any{s.capsule, s.maxICD})
	}
	for name, seeds := range map[string][][]byte{
		"FuzzCompletion":       completionSeeds(),
		"FuzzConnectData":      connectDataSeeds(),
		"FuzzCMPrivateData":    cmSeeds(),
		"FuzzIdentify":         identifySeeds(),
		"FuzzLogPages":         logSeeds(),
		"FuzzRegionDescriptor": regionSeeds(),
		"FuzzFrame":            frameSeeds(),
	} {
		for _, s := range seeds {
			corpora[name] = append(corpora[name], []any{s})
		}
	}
	for _, s := range dsmSeeds() {
		corpora["FuzzDSMRanges"] = append(corpora["FuzzDSMRanges"], []any{s.data, s.nr})
	}
	write := os.Getenv("NPRDMA_WRITE_FUZZ_SEEDS") == "1"
	for name, seeds := range corpora {
		dir := filepath.Join("testdata", "fuzz", name)
		if !write {
			files, err := os.ReadDir(dir)
			if err != nil || len(files) < len(seeds) {
				t.Errorf("%s: %d committed seeds, want %d (%v); run with NPRDMA_WRITE_FUZZ_SEEDS=1", dir, len(files), len(seeds), err)
			}
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, args := range seeds {
			var b bytes.Buffer
			b.WriteString("go test fuzz v1\n")
			for _, a := range args {
				b.WriteString(corpusValue(a) + "\n")
			}
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), b.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}
