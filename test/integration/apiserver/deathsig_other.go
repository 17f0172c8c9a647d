//go:build !linux

package apiserver

import "os/exec"

// setDeathSignal does nothing where the kernel has no parent-death signal:
// a test binary that dies may leave etcd running there.
func setDeathSignal(*exec.Cmd) {}
