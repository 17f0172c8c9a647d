package apiserver

import (
	"bytes"
	"fmt"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// child is a server process the test binary started: etcd or
// kube-apiserver. It dies with the test binary where the kernel allows
// (see setDeathSignal) and is stopped on the test's cleanup.
type child struct {
	cmd    *exec.Cmd
	done   chan struct{} // closed once the process has exited
	output *syncBuffer   // the process's stdout and stderr, the latest part
}

// startChild starts bin with args.
func startChild(bin string, args ...string) (*child, error) {
	c := &child{
		cmd:    exec.Command(bin, args...),
		done:   make(chan struct{}),
		output: &syncBuffer{},
	}
	c.cmd.Stdout = c.output
	c.cmd.Stderr = c.output
	// Reaped on Linux when the test binary dies (a timeout panic, a
	// kill): see setDeathSignal.
	setDeathSignal(c.cmd)

	// The parent-death signal belongs to the thread that forked, so start
	// and wait from one goroutine that holds its thread until the process
	// exits.
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := c.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = c.cmd.Wait() // the exit status is in ProcessState
		close(c.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	return c, nil
}

// exited reports whether the process has exited.
func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// stop ends the process: SIGTERM, then SIGKILL if it has not exited
// within timeout. It returns once the process has exited.
func (c *child) stop(timeout time.Duration) {
	if c.exited() {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-c.done:
	case <-timer.C:
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent use that keeps the
// latest syncBufferCap bytes written, so that a chatty process cannot fill
// memory while what it said last, as it failed, is kept.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

const syncBufferCap = 1 << 20

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(p) >= syncBufferCap {
		b.buf.Reset()
		b.buf.Write(p[len(p)-syncBufferCap:])
		return len(p), nil
	}
	if over := b.buf.Len() + len(p) - syncBufferCap; over > 0 {
		b.buf.Next(over)
	}
	b.buf.Write(p)
	return len(p), nil
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
