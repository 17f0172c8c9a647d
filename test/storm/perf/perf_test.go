//go:build schedulerperf

// Package perf runs kube-scheduler's own benchmark harness,
// k8s.io/kubernetes/test/integration/scheduler_perf, on the workloads of
// performance-config.yaml: SchedulingBasic and the storm of
// kubernetes#135900, with SchedulerAsyncAPICalls on. Whose APIDispatcher
// runs depends on how the package is built: as this module's go.mod says,
// upstream's; with the go.mod that cmd/modfile prints for "dispatch", the
// drop-in's. BENCHMARKS.md compares the two with benchstat.
//
// scheduler_perf starts an etcd of its own for each workload, the one in
// $PATH: the tests put the project's there (test/integration/apiserver's
// EtcdBinary: $ETCD_BIN, etcd in $PATH, or one built with Go), so that
// nothing but Go is needed. scheduler_perf checks for leaked goroutines
// after each workload itself (test/integration/framework's GoleakCheck).
//
// scheduler_perf runs kube-apiserver and kube-scheduler inside its test
// binary, so the package builds only with the build tag schedulerperf:
// without it, go test ./... in this module skips it, and never compiles
// kube-apiserver into a test binary (with -race, the longest compile
// there is). cmd/perfcompare sets the tag; to run the small workloads:
//
//	go test -count=1 -tags schedulerperf -run TestSchedulerPerf ./perf
package perf

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime/debug"
	"slices"
	"strings"
	"testing"

	_ "k8s.io/component-base/logs/json/register"
	apidispatcher "k8s.io/kubernetes/pkg/scheduler/backend/api_dispatcher"
	perf "k8s.io/kubernetes/test/integration/scheduler_perf"

	"github.com/coalescer/dispatch/test/integration/apiserver"
	"github.com/coalescer/dispatch/test/storm/internal/variant"
)

// config is the workloads' file, in this directory (go test runs in it).
const config = "performance-config.yaml"

// TestMain sets scheduler_perf up. Its workloads log at kube-scheduler's
// production verbosity (2), thousands of lines each: unless $ARTIFACTS
// names a directory for them, they go to a temporary one, where
// scheduler_perf keeps a workload's log only if it fails, and which is
// removed if every test passes. Benchmarks also write their data items
// (JSON, and a .dat file of throughput samples) into -data-items-dir,
// which defaults to the same directory here rather than to the package's.
func TestMain(m *testing.M) {
	if err := perf.InitTests(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	temp := ""
	if _, ok := os.LookupEnv("ARTIFACTS"); !ok {
		dir, err := os.MkdirTemp("", "scheduler-perf-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		temp = dir
		os.Setenv("ARTIFACTS", dir)
	}
	if f := flag.Lookup("data-items-dir"); f != nil && f.Value.String() == "" {
		if err := f.Value.Set(os.Getenv("ARTIFACTS")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	code := m.Run()
	if temp != "" {
		if code == 0 {
			os.RemoveAll(temp)
		} else {
			fmt.Fprintf(os.Stderr, "scheduler_perf's logs of the failed workloads: %s\n", temp)
		}
	}
	os.Exit(code)
}

// TestSchedulerPerf runs the small workloads, labelled integration-test, so
// that CI keeps performance-config.yaml valid and running.
func TestSchedulerPerf(t *testing.T) {
	etcdInPath(t)
	perf.RunIntegrationPerfScheduling(t, config)
}

// BenchmarkPerfScheduling runs the workloads labelled performance (see
// -perf-scheduling-label-filter) and reports scheduler_perf's data items:
// SchedulingThroughput (pods scheduled per second: average and
// percentiles) and, for the storm, the measured pods'
// scheduler_pod_scheduling_sli_duration (queue entry → bound, ms).
//
// The data items' file names carry the build: "upstream" or "dispatch".
func BenchmarkPerfScheduling(b *testing.B) {
	etcdInPath(b)
	perf.RunBenchmarkPerfScheduling(b, config, build(), nil)
}

// build tells which APIDispatcher this test binary links: "limiter" when it
// was built with the copy's tags of the model of kubernetes#142123,
// "dispatch" when the APIDispatcher of
// k8s.io/kubernetes/pkg/scheduler/backend/api_dispatcher holds one of our
// types (the drop-in's wraps kube/scheduler's Dispatcher), "upstream"
// otherwise. A test binary's build information
// lists no dependencies, so the type is what tells.
func build() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "-tags" && slices.Contains(strings.Split(s.Value, ","), variant.LimiterTag) {
				return "limiter" // the model of kubernetes#142123: upstream's with a limiter
			}
		}
	}
	t := reflect.TypeFor[apidispatcher.APIDispatcher]()
	for i := range t.NumField() {
		ft := t.Field(i).Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if strings.HasPrefix(ft.PkgPath(), "github.com/coalescer/dispatch/") {
			return "dispatch"
		}
	}
	return "upstream"
}

// client tells whose QPS and burst scheduler_perf's scheduler client has
// in this test binary: "config" (its configuration's clientConnection)
// when it was built with the drop-in copy's dispatch_perf_client tag,
// "harness" (scheduler_perf's 5 000, as released) otherwise. The tags are
// in the binary's build settings.
func client() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "-tags" && slices.Contains(strings.Split(s.Value, ","), variant.PerfClientTag) {
				return "config"
			}
		}
	}
	return "harness"
}

// TestBuild reports which APIDispatcher this binary links and whose rate
// its scheduler client has and, when $STORM_PERF_BUILD and
// $STORM_PERF_CLIENT say which they must be (cmd/perfcompare sets them),
// checks them.
func TestBuild(t *testing.T) {
	got, cl := build(), client()
	t.Logf("APIDispatcher: %s; the scheduler's client: %s", got, cl)
	if want := os.Getenv("STORM_PERF_BUILD"); want != "" && got != want {
		t.Fatalf("this binary links %s's APIDispatcher, want %s's", got, want)
	}
	if want := os.Getenv("STORM_PERF_CLIENT"); want != "" && cl != want {
		t.Fatalf("this binary's scheduler client has the %s's rate, want the %s's", cl, want)
	}
}

// etcdInPath puts the project's etcd first in $PATH, as "etcd", for the
// test.
func etcdInPath(tb testing.TB) {
	bin, err := apiserver.EtcdBinary(tb)
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	if err := os.Symlink(bin, filepath.Join(dir, "etcd")); err != nil {
		tb.Fatal(err)
	}
	tb.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
}
