package csi

import (
	"fmt"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// redactedValue stands in the log for every secret of a request.
const redactedValue = "<redacted>"

// redacted is req as one line of text for the log, with every field the
// CSI spec marks as a secret (the csi_secret option: the secrets maps of
// NodeStageVolume, CreateVolume, ...) redacted; a map keeps its keys, so
// that the log says which secrets a call carried.
func redacted(req any) string {
	m, ok := req.(proto.Message)
	if !ok {
		return fmt.Sprintf("%T", req)
	}
	c := proto.Clone(m)
	redact(c.ProtoReflect())
	return prototext.MarshalOptions{}.Format(c)
}

func redact(m protoreflect.Message) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if secret, _ := proto.GetExtension(fd.Options(), csipb.E_CsiSecret).(bool); secret {
			if fd.IsMap() && fd.MapValue().Kind() == protoreflect.StringKind {
				v.Map().Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
					v.Map().Set(k, protoreflect.ValueOfString(redactedValue))
					return true
				})
			} else {
				m.Clear(fd)
			}
			return true
		}
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(_ protoreflect.MapKey, e protoreflect.Value) bool {
					redact(e.Message())
					return true
				})
			}
		case fd.IsList():
			if fd.Message() != nil {
				for i := 0; i < v.List().Len(); i++ {
					redact(v.List().Get(i).Message())
				}
			}
		case fd.Message() != nil:
			redact(v.Message())
		}
		return true
	})
}
