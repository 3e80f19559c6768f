package nvme

import (
	"bytes"
	"errors"
	"reflect"
	"slices"
	"testing"
)

// Fuzz targets for every decoder of bytes that arrive from the network. The
// committed seed corpora live in testdata/fuzz/<name>/ (regenerate them with
// NPRDMA_WRITE_FUZZ_SEEDS=1 go test -run TestWriteFuzzSeeds ./nvme).

// FuzzCapsule: ParseCapsule never panics; every error is a *StatusError with
// DNR that keeps the CID; a valid capsule round-trips through
// MarshalCapsule; the command accessors never panic on what it accepts.
func FuzzCapsule(f *testing.F) {
	for _, s := range capsuleSeeds() {
		f.Add(s.capsule, s.maxICD)
	}
	f.Fuzz(func(t *testing.T, b []byte, maxICD uint16) {
		c, icd, err := ParseCapsule(b, int(maxICD))
		if err != nil {
			var se *StatusError
			if !errors.As(err, &se) || !se.Status.DNR() || se.Status.OK() {
				t.Fatalf("error %v is not a failing *StatusError with DNR", err)
			}
			if len(b) >= SQESize {
				var want Command
				_ = want.Unmarshal(b[:SQESize])
				if c != want {
					t.Fatalf("command not returned with the error")
				}
			} else if !errors.Is(err, ErrShortCapsule) {
				t.Fatalf("short capsule error %v", err)
			}
			return
		}
		if len(b)-SQESize > int(maxICD) {
			t.Fatalf("accepted %d bytes of ICD with a limit of %d", len(b)-SQESize, maxICD)
		}
		if icd != nil {
			off := c.DPTR.Address()
			if !c.DPTR.InCapsule() || uint64(len(icd)) != uint64(c.DPTR.Length()) ||
				!bytes.Equal(icd, b[SQESize+off:SQESize+off+uint64(len(icd))]) {
				t.Fatalf("in-capsule data does not match the SGL %v", c.DPTR)
			}
		}
		again := MarshalCapsule(&c, b[SQESize:])
		if !bytes.Equal(again, b) {
			t.Fatalf("round trip changed the capsule")
		}
		c2, icd2, err := ParseCapsule(again, int(maxICD))
		if err != nil || c2 != c || !bytes.Equal(icd2, icd) {
			t.Fatalf("reparse: %v", err)
		}
		// Accessors the controller calls on an accepted command.
		_ = c.Name(true) + c.Name(false)
		_, _ = c.Property()
		_, _ = c.CheckAuth(8192)
		_ = c.Connect()
		_ = c.GetLogPage().Length()
		_ = c.Features()
		_ = c.Identify()
		bio := c.BlockIO()
		_ = bio.CheckRange(1 << 20)
		_ = c.CheckTransfer(bio.Blocks()*512, 1<<20)
		_ = c.DatasetManagement().DataLength()
		_ = c.CheckNPGetRegionDescriptor()
		_ = c.DPTR.String()
		if c.IsFabrics() && c.FabricsType() == FabricsConnect && icd != nil {
			var d ConnectData
			_ = d.Unmarshal(icd)
		}
		if c.Opcode == IODatasetManagement && icd != nil {
			_, _ = ParseDSMRanges(icd, c.DatasetManagement().Ranges())
		}
	})
}

// FuzzCompletion: a 16-byte CQE round-trips exactly.
func FuzzCompletion(f *testing.F) {
	for _, s := range completionSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var c Completion
		if err := c.Unmarshal(b); err != nil {
			if len(b) == CQESize {
				t.Fatalf("16 bytes rejected: %v", err)
			}
			return
		}
		if !bytes.Equal(c.Marshal(), b) {
			t.Fatalf("round trip changed the CQE")
		}
		if err := c.Err(); (err == nil) != c.Status.OK() {
			t.Fatalf("Err() %v for status %v", err, c.Status)
		}
		_ = c.Status.String()
		_ = DecodeConnectResponse(c.DW0)
		_ = DecodeInvalidParameter(c.DW0)
		_ = DecodeAsyncEvent(c.DW0)
		_, _ = DecodeNumberOfQueues(c.DW0)
	})
}

// FuzzConnectData: the 1024-byte Connect data decodes without panics and
// what it decodes re-encodes to the same value.
func FuzzConnectData(f *testing.F) {
	for _, s := range connectDataSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var d ConnectData
		if err := d.Unmarshal(b); err != nil {
			if StatusOf(err) != StatusDataSGLLengthInvalid.WithDNR() {
				t.Fatalf("error %v", err)
			}
			return
		}
		out, err := d.Marshal()
		if err != nil {
			t.Fatalf("decoded data does not re-encode: %v", err)
		}
		var back ConnectData
		if err := back.Unmarshal(out); err != nil || back != d {
			t.Fatalf("round trip: %+v != %+v (%v)", back, d, err)
		}
		_ = ValidateNQN(d.SubNQN)
		_ = ValidateNQN(d.HostNQN)
	})
}

// FuzzCMPrivateData: the RDMA CM REQUEST, ACCEPT and REJECT decoders.
func FuzzCMPrivateData(f *testing.F) {
	for _, s := range cmSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := ParseCMRequest(b); err == nil {
			if back, err := ParseCMRequest(r.Marshal()); err != nil || back != r {
				t.Fatalf("request round trip %+v %v", back, err)
			}
		} else if _, ok := err.(*CMRejectError); !ok {
			t.Fatalf("request error %T is not a *CMRejectError", err)
		}
		if a, err := ParseCMAccept(b); err == nil {
			if back, err := ParseCMAccept(a.Marshal()); err != nil || back != a {
				t.Fatalf("accept round trip %+v %v", back, err)
			}
		}
		if r, err := ParseCMReject(b); err == nil {
			if back, err := ParseCMReject(r.Marshal()); err != nil || back != r {
				t.Fatalf("reject round trip %+v %v", back, err)
			}
			_ = r.Err().Error()
		}
	})
}

// FuzzIdentify: the Identify decoders an initiator uses (controller,
// namespace, active namespace list, descriptor list).
func FuzzIdentify(f *testing.F) {
	for _, s := range identifySeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var id IdentifyController
		if id.Unmarshal(b) == nil {
			_ = id.MaxTransfer(4096)
			if out, err := id.Marshal(); err == nil {
				var back IdentifyController
				if err := back.Unmarshal(out); err != nil || !reflect.DeepEqual(back, id) {
					t.Fatalf("controller round trip (%v)", err)
				}
			}
		}
		var ns IdentifyNamespace
		if ns.Unmarshal(b) == nil {
			_, _ = ns.BlockSize()
			if out, err := ns.Marshal(); err == nil {
				var back IdentifyNamespace
				if err := back.Unmarshal(out); err != nil || !reflect.DeepEqual(back, ns) {
					t.Fatalf("namespace round trip (%v)", err)
				}
			}
		}
		if ids, err := ParseNamespaceList(b); err == nil {
			var want []uint32 // ActiveNamespaceList never lists the broadcast NSID
			for _, id := range ids {
				if id != BroadcastNSID {
					want = append(want, id)
				}
			}
			back, err := ParseNamespaceList(ActiveNamespaceList(ids, 0))
			if err != nil || !slices.Equal(back, want) {
				t.Fatalf("namespace list round trip %v != %v (%v)", back, want, err)
			}
		}
		var nid NamespaceIDs
		if nid.Unmarshal(b) == nil {
			if out, err := nid.Marshal(); err == nil {
				var back NamespaceIDs
				if err := back.Unmarshal(out); err != nil || back != nid {
					t.Fatalf("descriptor list round trip %+v != %+v (%v)", back, nid, err)
				}
			}
		}
	})
}

// FuzzLogPages: the log page decoders (error information, SMART / health,
// firmware slot, changed namespace list, commands supported and effects).
func FuzzLogPages(f *testing.F) {
	for _, s := range logSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if entries, err := ParseErrorLog(b); err == nil {
			back, err := ParseErrorLog(MarshalErrorLog(entries))
			if err != nil || !slices.Equal(back, entries) {
				t.Fatalf("error log round trip (%v)", err)
			}
		}
		var h HealthLog
		if h.Unmarshal(b) == nil {
			var back HealthLog
			if err := back.Unmarshal(h.Marshal()); err != nil || back != h {
				t.Fatalf("health log round trip (%v)", err)
			}
		}
		var fw FirmwareSlotLog
		if fw.Unmarshal(b) == nil {
			if out, err := fw.Marshal(); err == nil {
				var back FirmwareSlotLog
				if err := back.Unmarshal(out); err != nil || back != fw {
					t.Fatalf("firmware log round trip (%v)", err)
				}
			}
		}
		var fx CommandEffectsLog
		if fx.Unmarshal(b) == nil {
			if !bytes.Equal(fx.Marshal()[:2048], b[:2048]) { // 2048-4095 are reserved
				t.Fatalf("effects log round trip changed bytes")
			}
		}
		if ids, overflow, err := ParseChangedNamespaceList(b); err == nil {
			back, backOverflow, err := ParseChangedNamespaceList(MarshalChangedNamespaceList(ids))
			if overflow {
				back, backOverflow, err = ParseChangedNamespaceList(MarshalChangedNamespaceList(make([]uint32, 1025)))
			}
			if err != nil || backOverflow != overflow || !slices.Equal(back, ids) {
				t.Fatalf("changed namespace list round trip: %v %v (%v), want %v %v", back, backOverflow, err, ids, overflow)
			}
		}
		if len(b) >= 8 {
			off := uint64(b[0]) * 4
			if out, err := SliceLog(b[8:], off, uint64(b[1])*4); err == nil {
				if uint64(len(out)) != uint64(b[1])*4 {
					t.Fatalf("SliceLog returned %d bytes", len(out))
				}
			}
		}
	})
}

// FuzzRegionDescriptor: the NP region descriptor decoder.
func FuzzRegionDescriptor(f *testing.F) {
	for _, s := range regionSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := ParseRegionDescriptor(b)
		if err != nil {
			return
		}
		if d.Blocks() == 0 {
			t.Fatalf("accepted an empty descriptor %+v", d)
		}
		used := 40
		if d.Format == RegionDescriptorFormat2 {
			used = 60
			last := d.FrameAddress(d.Frames - 1)
			if d.Frames == 0 || last < d.Address || last+uint64(d.FrameSize) < last ||
				d.BucketAddress(d.Buckets-1)+FrameBucketSize < d.TableAddress {
				t.Fatalf("accepted an unusable frame table %+v", d)
			}
		} else {
			if d.Address+d.Length < d.Address || d.Magic == 0 {
				t.Fatalf("accepted an unusable descriptor %+v", d)
			}
			if last, ok := d.BlockAddress(d.Blocks() - 1); !ok || last+uint64(d.LBASize) > d.Address+d.Length {
				t.Fatalf("last block outside the region")
			}
		}
		out, err := d.Marshal()
		if err != nil {
			t.Fatalf("accepted descriptor does not re-encode: %v", err)
		}
		if !bytes.Equal(out[:used], b[:used]) {
			t.Fatalf("round trip changed the descriptor")
		}
	})
}

// FuzzFrame: a frame table bucket and a frame, as a host reads them from
// a target's memory with RDMA READs. A frame is accepted only when it holds
// the block at an even version with a matching checksum.
func FuzzFrame(f *testing.F) {
	for _, s := range frameSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < 8 {
			return
		}
		seed, block := le.Uint64(b), uint64(b[0])%64
		rest := b[8:]
		if fr, ok := FindInBucket(rest, block); ok && fr > MaxFrames {
			t.Fatalf("frame %d from a bucket", fr)
		}
		data, ok := CheckFrame(seed, block, rest)
		if !ok {
			return
		}
		v := le.Uint64(rest[FrameVersionOffset:])
		if v&1 != 0 || le.Uint64(rest[FrameTagOffset:]) != block+1 || len(data) != len(rest)-FrameHeaderSize ||
			le.Uint64(rest[FrameSumOffset:]) != FrameChecksum(seed, block, v, data) {
			t.Fatalf("accepted a frame that does not prove itself")
		}
	})
}

// FuzzDSMRanges: the Dataset Management range list a host sends.
func FuzzDSMRanges(f *testing.F) {
	for _, s := range dsmSeeds() {
		f.Add(s.data, s.nr)
	}
	f.Fuzz(func(t *testing.T, b []byte, nr uint8) {
		n := int(nr) + 1
		ranges, err := ParseDSMRanges(b, n)
		if err != nil {
			if StatusOf(err) != StatusDataSGLLengthInvalid.WithDNR() {
				t.Fatalf("error %v", err)
			}
			return
		}
		out, err := MarshalDSMRanges(ranges)
		if err != nil || !bytes.Equal(out, b[:n*DSMRangeSize]) {
			t.Fatalf("round trip (%v)", err)
		}
		for _, r := range ranges {
			_ = r.CheckRange(1 << 30)
		}
	})
}
