// Package nvme is the NVMe command set as data types and codecs: 64-byte
// submission queue entries (Command), 16-byte completions, status codes,
// SGL descriptors, Identify structures, log pages, features, the Fabrics
// commands (Connect, Property Get/Set), the NVMe-oF RDMA CM private data and
// the NP vendor extension (region descriptor, advise), and the
// Authentication Send/Receive commands that carry nvme/dhchap messages.
//
// Every multi-byte field is little-endian and every structure is encoded by
// explicit byte offsets (no unsafe casts), so the layouts are easy to check
// against the specification. Decoders of bytes that come from the network
// never panic and return a *StatusError carrying the NVMe status a controller
// should answer with (see ParseCapsule); they are fuzzed.
//
// Naming: field names follow the specification's abbreviations (NSZE, MDTS,
// SQSIZE...) so they can be looked up; "0's based" fields hold the count
// minus one, as on the wire, and the types that carry them have methods that
// return the count.
package nvme
