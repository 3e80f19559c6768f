package nvme

import "fmt"

// SGLDescriptorSize is the size of one SGL descriptor.
const SGLDescriptorSize = 16

// SGLType is the descriptor type (high nibble of byte 15).
type SGLType uint8

// SGL descriptor types.
const (
	SGLTypeDataBlock          SGLType = 0x0
	SGLTypeBitBucket          SGLType = 0x1
	SGLTypeSegment            SGLType = 0x2
	SGLTypeLastSegment        SGLType = 0x3
	SGLTypeKeyedDataBlock     SGLType = 0x4
	SGLTypeTransportDataBlock SGLType = 0x5
)

// SGLSubtype is the descriptor subtype (low nibble of byte 15).
type SGLSubtype uint8

// SGL descriptor subtypes.
const (
	SGLSubtypeAddress       SGLSubtype = 0x0
	SGLSubtypeOffset        SGLSubtype = 0x1
	SGLSubtypeTransport     SGLSubtype = 0xa
	SGLSubtypeInvalidateKey SGLSubtype = 0xf
)

// Identifier bytes (byte 15) of the forms used over fabrics.
const (
	SGLIDKeyedAddress    uint8 = 0x40 // keyed data block, address
	SGLIDKeyedInvalidate uint8 = 0x4f // keyed data block, address, invalidate the key
	SGLIDInCapsule       uint8 = 0x01 // data block, offset into the in-capsule data
	SGLIDTransport       uint8 = 0x5a // transport data block (NVMe/TCP)
)

// MaxKeyedSGLLength is the largest length a keyed descriptor can carry (24
// bits).
const MaxKeyedSGLLength = 1<<24 - 1

// SGLDescriptor is one 16-byte SGL descriptor in wire form. ADDRESS u64 @0;
// LENGTH u32 @8 (unkeyed) or u24 @8 plus KEY u32 @11 (keyed); byte 15 =
// type<<4 | subtype. It stays raw so that a Command round-trips exactly; the
// accessors interpret it.
type SGLDescriptor [SGLDescriptorSize]byte

// KeyedSGL describes length bytes at addr in the host's memory registered
// with key (remote key): the target moves the data with RDMA READ/WRITE.
func KeyedSGL(addr uint64, length uint32, key uint32) (SGLDescriptor, error) {
	return keyed(addr, length, key, SGLIDKeyedAddress)
}

// KeyedSGLInvalidate is KeyedSGL asking the target to invalidate key when it
// completes the command (SEND with invalidate), as Linux hosts with FRWR
// registrations do.
func KeyedSGLInvalidate(addr uint64, length uint32, key uint32) (SGLDescriptor, error) {
	return keyed(addr, length, key, SGLIDKeyedInvalidate)
}

func keyed(addr uint64, length, key uint32, id uint8) (SGLDescriptor, error) {
	var d SGLDescriptor
	if length > MaxKeyedSGLLength {
		return d, fmt.Errorf("nvme: keyed SGL length %d exceeds the 24-bit maximum %d", length, MaxKeyedSGLLength)
	}
	le.PutUint64(d[0:], addr)
	d[8], d[9], d[10] = byte(length), byte(length>>8), byte(length>>16)
	le.PutUint32(d[11:], key)
	d[15] = id
	return d, nil
}

// NullSGL is the descriptor for a command that moves no data: a keyed data
// block of length 0, key 0 (what Linux hosts send).
func NullSGL() SGLDescriptor {
	var d SGLDescriptor
	d[15] = SGLIDKeyedAddress
	return d
}

// InCapsuleSGL describes length bytes of in-capsule data starting offset
// bytes after the SQE (ICDOFF is 0).
func InCapsuleSGL(offset uint64, length uint32) SGLDescriptor {
	var d SGLDescriptor
	le.PutUint64(d[0:], offset)
	le.PutUint32(d[8:], length)
	d[15] = SGLIDInCapsule
	return d
}

// TransportSGL is a transport data block of length bytes (NVMe/TCP: the data
// moves in C2HData/H2CData PDUs).
func TransportSGL(length uint32) SGLDescriptor {
	var d SGLDescriptor
	le.PutUint32(d[8:], length)
	d[15] = SGLIDTransport
	return d
}

// Type is the descriptor type.
func (d SGLDescriptor) Type() SGLType { return SGLType(d[15] >> 4) }

// Subtype is the descriptor subtype.
func (d SGLDescriptor) Subtype() SGLSubtype { return SGLSubtype(d[15] & 0xf) }

// ID is the identifier byte (type<<4 | subtype).
func (d SGLDescriptor) ID() uint8 { return d[15] }

// Address is the ADDRESS field: a host address for keyed descriptors, an
// offset into the in-capsule data for SGLSubtypeOffset.
func (d SGLDescriptor) Address() uint64 { return le.Uint64(d[0:]) }

// Keyed reports whether d is a keyed data block.
func (d SGLDescriptor) Keyed() bool { return d.Type() == SGLTypeKeyedDataBlock }

// Length is the LENGTH field: 24 bits for keyed descriptors, 32 otherwise.
func (d SGLDescriptor) Length() uint32 {
	if d.Keyed() {
		return uint32(d[8]) | uint32(d[9])<<8 | uint32(d[10])<<16
	}
	return le.Uint32(d[8:])
}

// Key is the KEY (remote key) of a keyed descriptor, 0 otherwise.
func (d SGLDescriptor) Key() uint32 {
	if !d.Keyed() {
		return 0
	}
	return le.Uint32(d[11:])
}

// InvalidateKey reports a keyed descriptor whose key the target should
// invalidate on completion.
func (d SGLDescriptor) InvalidateKey() bool { return d[15] == SGLIDKeyedInvalidate }

// InCapsule reports an in-capsule data descriptor (data block, offset).
func (d SGLDescriptor) InCapsule() bool { return d[15] == SGLIDInCapsule }

// Transport reports a transport data block.
func (d SGLDescriptor) Transport() bool { return d[15] == SGLIDTransport }

// Validate checks that d is one of the forms this package supports as SGL1:
// keyed data block (address or invalidate), data block with offset
// (in-capsule), or transport data block. Anything else, including segments
// (MSDBD is 1) and plain address data blocks (host memory is not reachable
// over a fabric), is SGL Descriptor Type Invalid with DNR.
func (d SGLDescriptor) Validate() error {
	switch d[15] {
	case SGLIDKeyedAddress, SGLIDKeyedInvalidate, SGLIDInCapsule, SGLIDTransport:
		return nil
	}
	return Errorf(StatusSGLDescriptorTypeInvalid.WithDNR(),
		"SGL descriptor type 0x%x subtype 0x%x is not supported", uint8(d.Type()), uint8(d.Subtype()))
}

func (d SGLDescriptor) String() string {
	switch {
	case d.Keyed():
		inv := ""
		if d.InvalidateKey() {
			inv = " invalidate"
		}
		return fmt.Sprintf("keyed{addr 0x%x len %d key 0x%x%s}", d.Address(), d.Length(), d.Key(), inv)
	case d.InCapsule():
		return fmt.Sprintf("in-capsule{offset %d len %d}", d.Address(), d.Length())
	case d.Transport():
		return fmt.Sprintf("transport{len %d}", d.Length())
	}
	return fmt.Sprintf("sgl{type 0x%x subtype 0x%x addr 0x%x len %d}", uint8(d.Type()), uint8(d.Subtype()), d.Address(), d.Length())
}
