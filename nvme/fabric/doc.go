// Package fabric binds the NVMe command set (package nvme) to the nprdma
// fabric the way the NVMe-oF RDMA transport binds it to verbs:
//
//   - a queue is one reliable-connected queue pair; its ID and sizes travel
//     in the connection request's private data (nvme.CMRequest), and the
//     controller answers with nvme.CMAccept or refuses with nvme.CMReject;
//   - the host SENDs 64-byte command capsules, with in-capsule data for small
//     writes on I/O queues, into receive buffers the controller posted;
//   - the controller SENDs 16-byte completions into receive buffers the host
//     posted;
//   - data that does not travel in the capsule is moved by the controller
//     with RDMA READ (host to controller) and RDMA WRITE (controller to host)
//     against keyed SGL descriptors naming the host's registered buffers; the
//     WRITE and the completion's SEND go out in one post, so RC ordering puts
//     the data in place before the completion.
//
// The controller side is Listener (accepting queues) and ControllerQueue
// (capsules in, Request per command, completions out); the host side is
// HostQueue (Dial, Submit, and ReadRemote for the one-sided reads of the NP
// extension on the same queue pair). docs/target.md and docs/initiator.md
// describe how the target and the initiator use them.
package fabric
