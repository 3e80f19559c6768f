// Package manageguest tests, in the guest lab, that the kernel's NVMe/TCP
// host follows a namespace that nprdma-target grows through its management
// API (the Namespace Attribute Changed notice and the Changed Namespace List
// log), over the target's NVMe/TCP port. The package has no code of its
// own.
package manageguest
