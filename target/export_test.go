package target

// FenceStates is how many hosts have a fencing state on s (a controller,
// or a failed queue still changing a namespace): none once all are gone.
func FenceStates(s *Subsystem) int {
	s.fenceMu.Lock()
	defer s.fenceMu.Unlock()
	return len(s.fences)
}
