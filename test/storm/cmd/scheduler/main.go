// Command scheduler runs kube-scheduler's scheduling loop — pkg/scheduler.New
// and Run with the default profile — against the apiserver a kubeconfig
// names, as the storm test's scheduler under test.
//
// The storm test builds this one source three ways: against
// k8s.io/kubernetes v1.37.2 as released (upstream's APIDispatcher with
// -async, the synchronous path without it), against a copy of that release
// whose pkg/scheduler/backend/api_dispatcher is dispatch's drop-in, and
// against the same copy with the build tags of its model of
// kubernetes#142123 (see package variant). Each build runs in a process of its own, as kube-scheduler does
// in a cluster, so that no variant shares a heap, a garbage collector or
// client connections with the test's kube-apiserver or with another variant.
//
// It sets the scheduler up as cmd/kube-scheduler does where that matters to
// the API traffic: one clientset for the scheduler and its informers and one
// for events, each with its own client-side token bucket (-qps, -burst:
// kube-scheduler's defaults, 50 and 100), protobuf on the wire, compression
// off. It writes JSON lines to stdout: one when the informers
// have synced and the scheduling loop runs, one with the scheduler's
// counters when it stops on SIGTERM or SIGINT, and one with the counters so
// far on each SIGUSR1 (see package schedout).
// klog writes to stderr.
//
// Usage:
//
//	scheduler -kubeconfig FILE [-async] [-qps 50] [-burst 100] [-parallelism 16] [-v N]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"syscall"

	dto "github.com/prometheus/client_model/go"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/events"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/scheduler"
	"k8s.io/kubernetes/pkg/scheduler/profile"

	"github.com/coalescer/dispatch/test/storm/internal/schedout"
	"github.com/coalescer/dispatch/test/storm/internal/variant"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "scheduler:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		kubeconfig  = flag.String("kubeconfig", "", "kubeconfig `file` of the apiserver to schedule against (required)")
		async       = flag.Bool("async", false, "enable the SchedulerAsyncAPICalls feature gate")
		qps         = flag.Float64("qps", 50, "client-side queries per second of each clientset (kube-scheduler's default)")
		burst       = flag.Int("burst", 100, "client-side burst of each clientset (kube-scheduler's default)")
		parallelism = flag.Int("parallelism", 16, "the scheduler's parallelism (kube-scheduler's default)")
	)
	klogFlags := flag.NewFlagSet("klog", flag.ExitOnError)
	klog.InitFlags(klogFlags)
	flag.Var(&forward{klogFlags.Lookup("v")}, "v", "klog verbosity")
	flag.Parse()
	if *kubeconfig == "" {
		return fmt.Errorf("-kubeconfig is required")
	}

	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(map[string]bool{
		string(features.SchedulerAsyncAPICalls): *async,
	}); err != nil {
		return err
	}

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return err
	}
	// As cmd/kube-scheduler's createKubeConfig and createClients.
	cfg.DisableCompression = true
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.QPS, cfg.Burst = float32(*qps), *burst
	client, err := kubernetes.NewForConfig(rest.AddUserAgent(rest.CopyConfig(cfg), "scheduler"))
	if err != nil {
		return err
	}
	eventClient, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: eventClient.EventsV1()})
	broadcaster.StartRecordingToSink(ctx.Done())
	defer broadcaster.Shutdown()

	informers := scheduler.NewInformerFactory(client, 0, nil)
	sched, err := scheduler.New(ctx, client, informers, nil, profile.NewRecorderFactory(broadcaster),
		scheduler.WithKubeConfig(cfg),
		scheduler.WithParallelism(int32(*parallelism)),
	)
	if err != nil {
		return fmt.Errorf("creating the scheduler: %w", err)
	}
	informers.Start(ctx.Done())
	defer func() {
		stop() // on an early return too: Shutdown waits for the informers to see ctx end
		informers.Shutdown()
	}()
	informers.WaitForCacheSync(ctx.Done())
	if err := sched.WaitForHandlersSync(ctx); err != nil {
		return fmt.Errorf("waiting for the event handlers: %w", err)
	}

	done := make(chan struct{})
	go func() {
		defer close(done)
		sched.Run(ctx)
	}()
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	defer signal.Stop(usr1)
	go func() {
		for {
			select {
			case <-usr1:
				if c, err := counters(); err == nil {
					_ = emit(schedout.Line{Event: schedout.Counters, Counters: c})
				}
			case <-done:
				return
			}
		}
	}()
	dispatcher, kube := linked()
	if err := emit(schedout.Line{Event: schedout.Ready, Dispatcher: dispatcher, Async: *async, Kubernetes: kube}); err != nil {
		return err
	}
	<-done
	counters, err := counters()
	if err != nil {
		return err
	}
	return emit(schedout.Line{Event: schedout.Stopped, Counters: counters})
}

// stdout serializes the lines, which two goroutines write.
var stdout sync.Mutex

// emit writes l as one JSON line to stdout.
func emit(l schedout.Line) error {
	b, err := json.Marshal(l)
	if err != nil {
		return err
	}
	stdout.Lock()
	defer stdout.Unlock()
	_, err = os.Stdout.Write(append(b, '\n'))
	return err
}

// linked tells which APIDispatcher the binary holds — "upstream",
// "limiter" (the model of kubernetes#142123, upstream's with a limiter) or
// "dispatch" — and where its k8s.io/kubernetes came from, from the build
// information.
func linked() (dispatcher, kube string) {
	dispatcher = "upstream"
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return dispatcher, "unknown"
	}
	for _, s := range info.Settings {
		if s.Key == "-tags" && slices.Contains(strings.Split(s.Value, ","), variant.LimiterTag) {
			dispatcher = "limiter" // the model of kubernetes#142123
		}
	}
	for _, m := range info.Deps {
		switch m.Path {
		case "github.com/coalescer/dispatch":
			dispatcher = "dispatch"
		case "k8s.io/kubernetes":
			kube = m.Version
			if m.Replace != nil {
				kube += " => " + strings.TrimSpace(m.Replace.Path+" "+m.Replace.Version)
			}
		}
	}
	return dispatcher, kube
}

// counters returns the scheduler's metrics the storm test reports.
func counters() (map[string]float64, error) {
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, f := range families {
		switch f.GetName() {
		case "scheduler_schedule_attempts_total", "scheduler_async_api_call_execution_total":
			for _, m := range f.GetMetric() {
				out[f.GetName()+labels(m)] = m.GetCounter().GetValue()
			}
		case "scheduler_pending_async_api_calls":
			for _, m := range f.GetMetric() {
				out[f.GetName()+labels(m)] = m.GetGauge().GetValue()
			}
		case "scheduler_scheduling_attempt_duration_seconds",
			"scheduler_pod_scheduling_sli_duration_seconds",
			"scheduler_async_api_call_execution_duration_seconds",
			"scheduler_framework_extension_point_duration_seconds":
			// Where the time went: sums and counts, so that the test
			// can take means.
			for _, m := range f.GetMetric() {
				if f.GetName() == "scheduler_framework_extension_point_duration_seconds" && !isBind(m) {
					continue
				}
				h := m.GetHistogram()
				out[f.GetName()+"_sum"+labels(m)] = h.GetSampleSum()
				out[f.GetName()+"_count"+labels(m)] = float64(h.GetSampleCount())
			}
		}
	}
	return out, nil
}

// isBind says whether m is the Bind extension point's: with the feature
// gate on, the time from the binding's Add to its outcome.
func isBind(m *dto.Metric) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == "extension_point" {
			return l.GetValue() == "Bind"
		}
	}
	return false
}

// labels formats m's labels as {name=value,...}.
func labels(m *dto.Metric) string {
	var parts []string
	for _, l := range m.GetLabel() {
		parts = append(parts, l.GetName()+"="+l.GetValue())
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// forward is a flag.Value that sets a flag of another set, so that -v is
// klog's without exposing every klog flag.
type forward struct{ f *flag.Flag }

func (v *forward) String() string {
	if v.f == nil {
		return ""
	}
	return v.f.Value.String()
}
func (v *forward) Set(s string) error { return v.f.Value.Set(s) }
