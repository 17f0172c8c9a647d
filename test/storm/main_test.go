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
// What logs through klog's global logger in this process (client-go, under
// the test's informers) goes to <-storm.out>/apiserver.log when
// -storm.out is given, and nowhere otherwise; the kube-apiservers and the
// schedulers run in processes of their own, whose logs are shown when a
// run fails (and the schedulers' kept in -storm.out too).
//
// goleak exempts nothing: no server runs in this process. It waits a few
// seconds for goroutines to end on their own timers after the servers
// stop.
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

// noLeaks returns goleak's finding if goroutines are still running after
// wait.
func noLeaks(wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		err := goleak.Find()
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
