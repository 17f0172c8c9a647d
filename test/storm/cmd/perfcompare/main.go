// Command perfcompare runs the scheduler_perf benchmarks of ./perf with
// upstream's APIDispatcher and with dispatch's drop-in, interleaved on the
// same machine, and writes each build's output for benchstat:
//
//	go run ./cmd/perfcompare -count 6 -o results/perf
//	benchstat results/perf/upstream.txt results/perf/dispatch.txt
//
// It compiles ./perf twice with package variant (go test -c outside the
// workspace, with the build tag schedulerperf that ./perf needs), both against the drop-in's copy of k8s.io/kubernetes, from
// the same sources: with the copy's dispatch_upstream tag for upstream's
// APIDispatcher, without it for dispatch's. With -client config (the
// default), both builds also take the copy's dispatch_perf_client tag:
// scheduler_perf's scheduler gets a client at its configuration's QPS and
// burst (kube-scheduler's 50 and 100), as in a cluster, rather than the
// harness's 5 000, which no token bucket limits; -client harness builds
// scheduler_perf as released. Then it runs
// the two test binaries one after the other, -count times, each run one
// iteration of every benchmark -bench selects (scheduler_perf workloads
// run once per iteration). The binaries run in ./perf, where the workloads'
// config is; their logs go to a temporary directory, kept if a run fails,
// and scheduler_perf's data items (JSON, one file per run) to upstream/ and
// dispatch/ under the output directory.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"github.com/coalescer/dispatch/test/storm/internal/variant"
)

// perfTag is the build tag without which ./perf does not build.
const perfTag = "schedulerperf"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "perfcompare:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		count = flag.Int("count", 6, "runs of each build")
		bench = flag.String("bench", ".", "benchmarks to run (go test -bench)")
		out   = flag.String("o", "perf-results", "`directory` for upstream.txt and dispatch.txt")
		cl    = flag.String("client", "config", "the scheduler's client: config (its configuration's QPS and burst) or harness (scheduler_perf's 5 000, as released)")
		model = flag.Bool("limiter", true, "run the model of kubernetes#142123 too (limiter.txt): upstream's APIDispatcher with a limiter of the failure handler's status patches")
	)
	flag.Parse()
	common := []string{perfTag}
	switch *cl {
	case "config":
		common = append(common, variant.PerfClientTag)
	case "harness":
	default:
		return fmt.Errorf("-client %q: want config or harness", *cl)
	}
	tags := map[string][]string{
		variant.Upstream: append([]string{variant.BaselineTag}, common...),
		variant.Limiter:  append(variant.Tags(variant.Limiter), common...),
		variant.Dispatch: common,
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	root, err := variant.Root()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	abs, err := filepath.Abs(*out)
	if err != nil {
		return err
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	bins, err := os.MkdirTemp("", "perfcompare-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(bins)

	builds := []string{variant.Upstream, variant.Dispatch}
	if *model {
		builds = []string{variant.Upstream, variant.Limiter, variant.Dispatch}
	}
	results := map[string]*os.File{}
	for _, build := range builds {
		start := time.Now()
		// Both from the copy: the tags choose the APIDispatcher.
		modfile, err := variant.Modfile(ctx, variant.Dispatch, filepath.Join(cache, "dispatch-storm"))
		if err != nil {
			return err
		}
		if err := variant.TestBinary(ctx, modfile, "./perf", filepath.Join(bins, build+".test"), false, tags[build]...); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "perfcompare: built ./perf for %s (tags %q) in %v\n", build, tags[build], time.Since(start).Round(time.Second))
		// The binary must link the build's APIDispatcher and give the
		// scheduler the client asked for (perf's TestBuild).
		check := exec.CommandContext(ctx, filepath.Join(bins, build+".test"), "-test.run=^TestBuild$", "-test.v")
		check.Dir = filepath.Join(root, "perf")
		check.Env = append(os.Environ(), "STORM_PERF_BUILD="+build, "STORM_PERF_CLIENT="+*cl)
		if b, err := check.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: the test binary links the wrong APIDispatcher: %w\n%s", build, err, b)
		}
		f, err := os.Create(filepath.Join(*out, build+".txt"))
		if err != nil {
			return err
		}
		defer f.Close()
		results[build] = f
	}

	for i := range *count {
		for _, build := range builds {
			start := time.Now()
			cmd := exec.CommandContext(ctx, filepath.Join(bins, build+".test"),
				"-test.run=^$", "-test.bench="+*bench, "-test.benchtime=1x",
				"-data-items-dir="+filepath.Join(abs, build))
			cmd.Dir = filepath.Join(root, "perf")
			cmd.Stdout = results[build]
			cmd.Stderr = os.Stderr
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("%s, run %d: %w", build, i+1, err)
			}
			fmt.Fprintf(os.Stderr, "perfcompare: %s run %d of %d in %v\n", build, i+1, *count, time.Since(start).Round(time.Second))
		}
	}
	var files []string
	for _, build := range builds {
		files = append(files, filepath.Join(*out, build+".txt"))
	}
	fmt.Fprintf(os.Stderr, "perfcompare: wrote %s; compare with\n\tbenchstat %s\n", *out, strings.Join(files, " "))
	return nil
}
