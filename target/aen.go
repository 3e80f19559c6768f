package target

import (
	"slices"

	"github.com/nprdma/nprdma/nvme"
)

// Namespace Attribute Changed notices. When a namespace of a subsystem is
// created, resized or deleted, every controller of the subsystem records its
// NSID in its Changed Namespace List log (0x04) and, if the host enabled the
// notice (Set Features Asynchronous Event Configuration bit 8, which Linux
// and the nprdma initiator set), completes a parked Asynchronous Event
// Request with it, or the next one to arrive. After that the notice is
// masked until the host reads the log with RAE clear, as the specification
// has it: reading the log clears it, and a change after the read raises the
// notice again.

// maxChangedNamespaces is how many NSIDs the log holds; beyond, it holds the
// overflow marker alone and the host rescans every namespace.
const maxChangedNamespaces = nvme.ChangedNamespaceListSize / 4

// nsEvents is a controller's share of the notices, guarded by its mu.
type nsEvents struct {
	changed  []uint32 // NSIDs changed since the host last read the log
	overflow bool     // more than maxChangedNamespaces changed
	pending  bool     // a notice is due but no AER was parked
	masked   bool     // a notice was sent; the host has not read the log yet
}

// supportedAEC: the notices this target raises.
const supportedAEC = nvme.AECNamespaceAttribute

// namespaceNotice is the AER completion of a Namespace Attribute Changed
// notice: the host reads log 0x04 next.
var namespaceNotice = nvme.AsyncEvent{Type: nvme.AsyncEventNotice, Info: nvme.NoticeNamespaceAttributeChanged,
	Log: nvme.LogChangedNamespaces}.DW0()

// namespaceChanged tells every controller of the subsystem that namespace
// nsid changed (created, resized or deleted).
func (s *Subsystem) namespaceChanged(nsid uint32) {
	for _, c := range s.t.controllers() {
		if c.sub == s {
			c.namespaceChanged(nsid)
		}
	}
}

func (c *controller) namespaceChanged(nsid uint32) {
	c.mu.Lock()
	e := &c.events
	if !e.overflow && !slices.Contains(e.changed, nsid) {
		if len(e.changed) == maxChangedNamespaces {
			e.changed, e.overflow = nil, true
		} else {
			e.changed = append(e.changed, nsid)
		}
	}
	if c.gone || e.masked || nvme.AsyncEventConfig(c.aec)&nvme.AECNamespaceAttribute == 0 {
		c.mu.Unlock()
		return
	}
	if len(c.aers) == 0 {
		e.pending = true
		c.mu.Unlock()
		return
	}
	r := c.aers[0]
	c.aers = c.aers[1:]
	e.masked, e.pending = true, false
	c.mu.Unlock()
	r.Complete(nvme.Completion{DW0: namespaceNotice})
}

// takeNoticeLocked returns a notice that waited for an AER, for an AER that
// arrives: it completes at once instead of parking. The caller holds c.mu.
func (c *controller) takeNoticeLocked() (uint32, bool) {
	e := &c.events
	if !e.pending || e.masked {
		return 0, false
	}
	e.pending, e.masked = false, true
	return namespaceNotice, true
}

// changedNamespaceLog returns the Changed Namespace List log and clears it;
// without rae (Retain Asynchronous Event) the notice is unmasked.
func (c *controller) changedNamespaceLog(rae bool) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := &c.events
	ids := e.changed
	if e.overflow {
		ids = make([]uint32, maxChangedNamespaces+1) // the overflow marker
	}
	b := nvme.MarshalChangedNamespaceList(ids)
	e.changed, e.overflow = nil, false
	if !rae {
		e.masked = false
	}
	return b
}
