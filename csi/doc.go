// Package csi is the Kubernetes Container Storage Interface driver of
// nprdma (cmd/nprdma-csi): its controller service creates each volume as a
// namespace of a subsystem of its own on the target with the most free
// capacity of those it is given, through each target's management API
// (target/manage), and lets a node's host in by adding its host NQN to that
// subsystem; its node service attaches the namespace with the
// nprdma-initiator binary (fuse mode: a loop device), authenticating with
// the DH-HMAC-CHAP secrets of the request where the target requires it
// (dhchap.go), makes a file system where there is none, and mounts it.
// docs/kubernetes.md describes it.
package csi
