// Package manageguest tests, in the guest lab, that the kernel's NVMe/TCP
// host follows a namespace that nprdma-target grows through its management
// API (the Namespace Attribute Changed notice and the Changed Namespace List
// log). Its test file is kept out of the build until the target's NVMe/TCP
// port is in the module (see resize_guest_test.go).
package manageguest
