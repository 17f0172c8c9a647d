package apiserver

import (
	"runtime"
	"strings"
	"time"
)

// Settle waits until the goroutines that stopped in-process servers leave
// running have ended, or timeout has passed, and reports whether they
// ended. Call it after the tests and before a goroutine-leak check
// (goleak), so that the check fails on goroutines that never end, not on
// the server's that end a moment later.
//
// [Start]'s servers run in processes of their own and leave no goroutine
// in the test binary: after them Settle returns at once. It is for a test
// binary that runs kube-apiserver in-process (upstream's test server, as
// scheduler_perf does), where an in-process server's teardown returns once kube-apiserver has stopped, not once
// every goroutine it started has: its watch cache starts a goroutine for
// each read it must serve fresh (a consistent list, which the apiserver's
// own informers make again as their watches close during shutdown), and
// that goroutine sleeps out the cache's block timeout, 3 seconds, even when
// the read was served at once. goleak retries for less than half a second.
//
// Settle waits for every goroutine with a frame in kube-apiserver's
// packages or its etcd client's (serverPackages) — but never for one with
// a frame of this repository's code, whose goroutines a leak check must see
// as they are, nor for one in wait.Forever, as kube-apiserver's klog health
// check is: it never ends (the leak check ignores it by that function).
// A server goroutine left after timeout is the leak check's to report.
func Settle(timeout time.Duration) bool {
	return settle(timeout, allStacks)
}

// settleInterval is how often Settle looks at the goroutines: nothing
// signals that a goroutine has ended, so it polls.
const settleInterval = 20 * time.Millisecond

func settle(timeout time.Duration, stacks func() []byte) bool {
	deadline := time.Now().Add(timeout)
	for serverGoroutines(stacks()) > 0 {
		if !time.Now().Before(deadline) {
			return false
		}
		time.Sleep(settleInterval)
	}
	return true
}

// serverPackages are the import paths, as prefixes, of kube-apiserver,
// the servers it chains (extensions, aggregator) and its etcd client,
// gRPC included.
var serverPackages = []string{
	"k8s.io/apiserver/",
	"k8s.io/kubernetes/",
	"k8s.io/apiextensions-apiserver/",
	"k8s.io/kube-aggregator/",
	"go.etcd.io/etcd/",
	"google.golang.org/grpc",
}

const (
	// ourPackages is this repository's import path prefix.
	ourPackages = "github.com/coalescer/dispatch"
	// forever is the function of the loops that never end.
	forever = "k8s.io/apimachinery/pkg/util/wait.Forever"
)

// serverGoroutines counts the goroutines in dump, as runtime.Stack writes
// them, that Settle waits for.
func serverGoroutines(dump []byte) int {
	n := 0
	for g := range strings.SplitSeq(string(dump), "\n\n") {
		if isServers(g) {
			n++
		}
	}
	return n
}

// isServers reports whether the goroutine g, one block of a stack dump
// (a "goroutine N [state]:" line, then a function line and a file line
// per frame, and a "created by" line and its file), is one Settle waits
// for.
func isServers(g string) bool {
	lines := strings.Split(g, "\n")
	if !strings.HasPrefix(lines[0], "goroutine ") {
		return false
	}
	server := false
	for _, line := range lines[1:] {
		if strings.HasPrefix(line, "\t") {
			continue // a file and line
		}
		fn := strings.TrimPrefix(line, "created by ")
		switch {
		case strings.HasPrefix(fn, ourPackages), strings.HasPrefix(fn, forever+"("):
			return false
		case hasAnyPrefix(fn, serverPackages):
			server = true
		}
	}
	return server
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// allStacks returns the stacks of all goroutines.
func allStacks() []byte {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return buf[:n]
		}
		buf = make([]byte, 2*len(buf))
	}
}
