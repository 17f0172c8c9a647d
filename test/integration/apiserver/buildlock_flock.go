//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd

package apiserver

import (
	"os"
	"path/filepath"
	"syscall"
)

// lockDir takes an exclusive flock(2) on dir/.lock, waiting for it, and
// returns its release. The kernel drops the lock if the process dies.
func lockDir(dir string) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil // closing the file releases the lock
}
