package apiserver

import (
	"os/exec"
	"syscall"
)

// setDeathSignal has the kernel kill the child when the thread that started
// it exits, so that etcd does not outlive a test binary that dies.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
