package differential

import (
	"flag"
	"io"
	"testing"

	"go.uber.org/goleak"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/scheduler/metrics"
)

func TestMain(m *testing.M) {
	// Upstream's dispatcher records kube-scheduler's metrics, whose
	// vectors are nil until registered.
	metrics.Register()
	registerExecutionMetrics()
	// Upstream's calls log through klog's global logger when their context
	// carries none (upstream's dispatcher gives them none): every 403 a
	// script answers with would be printed.
	flag.Parse()
	if !testing.Verbose() {
		fs := flag.NewFlagSet("klog", flag.PanicOnError)
		klog.InitFlags(fs)
		_ = fs.Set("logtostderr", "false")
		_ = fs.Set("stderrthreshold", "FATAL")
		klog.SetOutput(io.Discard)
	}
	goleak.VerifyTestMain(m,
		// klog's flush daemon, started by the scheduler's packages' init.
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
	)
}
