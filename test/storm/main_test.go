package storm

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/coalescer/dispatch/test/integration/testrun"
	"go.uber.org/goleak"
	"k8s.io/klog/v2"
)

// TestMain builds the schedulers TestStorm runs (see buildSchedulers),
// keeps the output readable and fails the package if a goroutine outlives
// the tests.
//
// The kube-apiservers the tests start in this process log through klog's
// global logger: hundreds of lines a run, which go to
// <-storm.out>/apiserver.log when -storm.out is given, and nowhere
// otherwise. (What they log through the test's own logger stays in the
// test's output.) The scheduler processes' logs are shown when a run
// fails, and kept in -storm.out too.
//
// goleak ignores the one goroutine kube-apiserver forces (see
// test/integration's TestMain): its klog health check, started on the
// first /healthz as a wait.Forever loop nothing can stop. And it waits a
// few seconds for the others to end: the apiserver's watch cache leaves a
// goroutine behind each read that waited for a fresh resourceVersion, which
// ends by itself after its 3 s block timeout (k8s.io/apiserver's
// watchCache.waitUntilFreshLocked).
func TestMain(m *testing.M) {
	flag.Parse()
	closeLog, err := redirectKlog(*outFlag)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if testrun.Selected("TestStorm") {
		dir, err := os.MkdirTemp("", "storm-schedulers-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		prebuiltDir = dir
		prebuilt = &built{}
		if variants, err := selectedVariants(); err != nil {
			prebuilt.err = err
		} else {
			prebuilt = buildSchedulers(context.Background(), dir, variants)
		}
	}
	code := m.Run()
	if code == 0 {
		if err := noLeaks(10 * time.Second); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	closeLog()
	if dir := prebuiltDir; dir != "" {
		os.RemoveAll(dir)
	}
	os.Exit(code)
}

// prebuiltDir holds the schedulers TestMain built; it removes it at the end.
var prebuiltDir string

// noLeaks returns goleak's finding if goroutines other than the ignored one
// are still running after wait.
func noLeaks(wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		err := goleak.Find(goleak.IgnoreAnyFunction("k8s.io/apimachinery/pkg/util/wait.Forever"))
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(500 * time.Millisecond) // goroutines ending on their own timers
	}
}

// redirectKlog sends klog's global output to dir/apiserver.log, or
// discards it when dir is "".
func redirectKlog(dir string) (closeLog func(), err error) {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	for name, value := range map[string]string{"logtostderr": "false", "alsologtostderr": "false", "stderrthreshold": "FATAL"} {
		if err := fs.Set(name, value); err != nil {
			return nil, err
		}
	}
	var out io.Writer = io.Discard
	closeLog = func() {}
	if dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		f, err := os.Create(filepath.Join(dir, "apiserver.log"))
		if err != nil {
			return nil, err
		}
		out, closeLog = f, func() { klog.Flush(); f.Close() }
	}
	klog.SetOutput(out)
	return closeLog, nil
}
