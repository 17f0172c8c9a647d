package storm

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/coalescer/dispatch/test/storm/internal/schedout"
)

// How long the scheduler process may take to come up, to finish the
// binding cycles of pods the server has bound (see settle), and to stop
// after SIGTERM before it is killed.
const (
	schedulerStartTimeout  = 2 * time.Minute
	schedulerSettleTimeout = 30 * time.Second
	schedulerStopTimeout   = 30 * time.Second
)

// schedProcess is a scheduler command running as a child of the test
// binary.
type schedProcess struct {
	cmd    *exec.Cmd
	ready  schedout.Line
	lines  chan schedout.Line // the lines after ready
	exited chan struct{}      // closed once the process has exited
	log    string             // its stderr, klog's output

	stopOnce sync.Once
	counters map[string]float64
}

// startScheduler starts the scheduler binary against the apiserver cfg
// reaches (through the proxy, as the test's unprivileged user), as v says,
// with its log (klog's) in the file logPath, or in a temporary one if it is
// "". It waits for the ready line and stops the scheduler when the test
// ends if stop has not.
func startScheduler(t *testing.T, bin string, cfg *rest.Config, v schedVariant, logPath string) *schedProcess {
	t.Helper()
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"storm": {Server: cfg.Host, CertificateAuthorityData: cfg.CAData}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{"storm": {Token: cfg.BearerToken}},
		Contexts:       map[string]*clientcmdapi.Context{"storm": {Cluster: "storm", AuthInfo: "storm"}},
		CurrentContext: "storm",
	}, kubeconfig))

	p := &schedProcess{
		lines:  make(chan schedout.Line, 4),
		exited: make(chan struct{}),
		log:    logPath,
	}
	if p.log == "" {
		p.log = filepath.Join(dir, "scheduler.log")
	}
	stderr, err := os.Create(p.log)
	require.NoError(t, err)
	p.cmd = exec.Command(bin,
		"-kubeconfig="+kubeconfig,
		"-async="+strconv.FormatBool(v.async),
		"-v="+strconv.Itoa(*verbosityFlag),
	)
	p.cmd.Stderr = stderr
	// A pipe of our own rather than StdoutPipe, whose reader Wait closes
	// at the exit, possibly before the last line is read.
	stdout, stdoutW, err := os.Pipe()
	require.NoError(t, err)
	p.cmd.Stdout = stdoutW
	// The kernel kills the scheduler if the test binary dies (a timeout
	// panic, a kill); the parent-death signal belongs to the thread that
	// forked, so one goroutine holds its thread from start to exit.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := p.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	err = <-started
	stdoutW.Close() // the child has its copy: stdout ends when it exits
	if err != nil {
		stdout.Close()
		stderr.Close()
		t.Fatalf("start %s: %v", bin, err)
	}
	go func() {
		defer close(p.lines)
		defer stdout.Close()
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var l schedout.Line
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				continue // not ours: a library printing to stdout
			}
			p.lines <- l
		}
	}()
	t.Cleanup(func() {
		p.stop(t)
		stderr.Close()
	})

	select {
	case l, ok := <-p.lines:
		if !ok || l.Event != schedout.Ready {
			p.stop(t) // reports the exit and the log
			t.Fatalf("scheduler exited before it was ready")
		}
		p.ready = l
	case <-time.After(schedulerStartTimeout):
		t.Fatalf("scheduler not ready after %v\nlog (tail):\n%s", schedulerStartTimeout, p.logTail())
	}
	return p
}

// settle waits until the scheduler counts at least bound pods scheduled:
// the binding cycles that the server's bindings ended have returned too,
// so that stopping the scheduler cancels none of them. It asks with
// SIGUSR1, every 100 ms, for at most schedulerSettleTimeout, and reports
// whether the scheduler got there.
func (p *schedProcess) settle(bound int) bool {
	deadline := time.After(schedulerSettleTimeout)
	ask := time.NewTicker(100 * time.Millisecond)
	defer ask.Stop()
	_ = p.cmd.Process.Signal(syscall.SIGUSR1)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				return false
			}
			if l.Event == schedout.Counters && l.Counters[schedout.ScheduledKey] >= float64(bound) {
				return true
			}
		case <-ask.C:
			_ = p.cmd.Process.Signal(syscall.SIGUSR1)
		case <-deadline:
			return false
		}
	}
}

// stop sends SIGTERM, waits for the stopped line and the exit (killing the
// process if it takes too long), and returns the scheduler's counters. It
// fails the test if the scheduler did not stop cleanly. Later calls return
// the first one's counters.
func (p *schedProcess) stop(t *testing.T) map[string]float64 {
	t.Helper()
	p.stopOnce.Do(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		deadline := time.After(schedulerStopTimeout)
		// The lines end when the process exits (it holds stdout's only
		// writer).
		for lines := p.lines; lines != nil; {
			select {
			case l, ok := <-lines:
				switch {
				case !ok:
					lines = nil
				case l.Event == schedout.Stopped:
					p.counters = l.Counters
				}
			case <-deadline:
				_ = p.cmd.Process.Kill()
				<-p.exited
				t.Errorf("scheduler did not stop within %v of SIGTERM; killed\nlog (tail):\n%s", schedulerStopTimeout, p.logTail())
				return
			}
		}
		<-p.exited
		if !p.cmd.ProcessState.Success() {
			t.Errorf("scheduler: %v\nlog (tail):\n%s", p.cmd.ProcessState, p.logTail())
		}
	})
	return p.counters
}

// logTail returns the end of the scheduler's log.
func (p *schedProcess) logTail() string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", p.log, err)
	}
	b = bytes.TrimSpace(b)
	const n = 8 << 10
	if len(b) > n {
		b = append([]byte("…"), b[len(b)-n:]...)
	}
	return string(b)
}
