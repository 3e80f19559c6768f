package target

import "encoding/json"

// FenceStates is how many hosts have a fencing state on s (a controller,
// or a failed queue still changing a namespace): none once all are gone.
func FenceStates(s *Subsystem) int {
	s.fenceMu.Lock()
	defer s.fenceMu.Unlock()
	return len(s.fences)
}

// SubsystemRecord is the JSON of subsystem s's record in the metadata
// store, as stored.
func SubsystemRecord(s *Subsystem) ([]byte, error) {
	var raw json.RawMessage
	_, err := s.t.meta.get(subsystemKey(s.nqn, s.managed), &raw)
	return raw, err
}
