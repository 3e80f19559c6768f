package nprdma

// PageRange is a run of suspected-fault pages found in a READ's destination.
type PageRange struct {
	// Off is the offset of the run in the destination buffer.
	Off int
	// Addr is the remote address of the run (the READ's remote address +
	// Off), what a two-sided re-read names.
	Addr uint64
	// Len is the length of the run in bytes.
	Len int
}

// FindMagicPages finds the parts of buf, the destination of a READ of
// len(buf) bytes at remoteAddr from an unpinned region at mrAddr with the
// given page size and magic, that hold the magic page: each page of the
// remote range is checked over the part buf covers (a READ may start or end
// mid-page), first its first 8 bytes, then all of it, against the magic at
// the right phase. Adjacent pages merge into one range. Every range is a
// suspected fault: the page was not resident or changed while it was read,
// or (rarely) it really holds the magic pattern; re-reading it two-sided is
// always correct.
func FindMagicPages(buf []byte, remoteAddr, mrAddr uint64, pageSize int, magic uint64) []PageRange {
	var out []PageRange
	forMagicPages(buf, remoteAddr, mrAddr, pageSize, magic, func(off, n int) {
		if k := len(out) - 1; k >= 0 && out[k].Off+out[k].Len == off {
			out[k].Len += n
			return
		}
		out = append(out, PageRange{Off: off, Addr: remoteAddr + uint64(off), Len: n})
	})
	return out
}

func forMagicPages(buf []byte, remoteAddr, mrAddr uint64, pageSize int, magic uint64, found func(off, n int)) {
	if pageSize <= 0 || remoteAddr < mrAddr {
		return
	}
	ps := uint64(pageSize)
	for pos := 0; pos < len(buf); {
		rel := remoteAddr + uint64(pos) - mrAddr
		n := int(min(uint64(len(buf)-pos), (rel/ps+1)*ps-rel))
		part := buf[pos : pos+n]
		phase := int(rel % 8)
		if matchPhase(part[:min(8, n)], magic, phase) && matchPhase(part, magic, phase) {
			found(pos, n)
		}
		pos += n
	}
}

// FindMagicPages is the package function FindMagicPages, counting the pages
// found in the device's suspected-fault counter.
func (d *Device) FindMagicPages(buf []byte, remoteAddr, mrAddr uint64, pageSize int, magic uint64) []PageRange {
	var pages uint64
	var out []PageRange
	forMagicPages(buf, remoteAddr, mrAddr, pageSize, magic, func(off, n int) {
		pages++
		if k := len(out) - 1; k >= 0 && out[k].Off+out[k].Len == off {
			out[k].Len += n
			return
		}
		out = append(out, PageRange{Off: off, Addr: remoteAddr + uint64(off), Len: n})
	})
	if pages > 0 { // a shared cache line: the no-fault path leaves it alone
		d.suspected.Add(pages)
	}
	return out
}
