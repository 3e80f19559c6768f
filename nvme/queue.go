package nvme

import "errors"

// ErrQueueFailed is wrapped by the errors of commands on a queue of any
// transport binding (the nprdma fabric, NVMe/TCP) whose connection failed
// or that was closed: the command may or may not have run, and a new
// connection is what cures it.
var ErrQueueFailed = errors.New("nvme: queue failed")
