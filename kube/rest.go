package kube

import "k8s.io/client-go/rest"

// RESTConfig returns a copy of cfg for the dispatcher's own clientset,
// with client-go's client-side rate limiting turned off: QPS -1 (client-go
// makes no token bucket for a negative QPS) and no RateLimiter. The
// dispatcher limits the rate itself (Options.QPS), after it has ordered
// calls by priority.
//
// Why not leave client-go's bucket in place: it sits behind the workers.
// A worker has already taken its call when it waits for the bucket, so a
// binding submitted during a storm of status patches finds every worker's
// patch ahead of it in the bucket's queue, and waits for all of them — the
// priority order is lost at the point where the scarce resource is handed
// out (kubernetes#135900). Two limits in series also make the effective
// rate the lower of the two, and client-go's waits never show in the
// dispatcher's queue-wait figures.
//
// Build the clientset for the dispatcher alone, so that the rest of the
// program (informers, events) keeps its own limit:
//
//	cs, err := kubernetes.NewForConfig(kube.RESTConfig(cfg))
func RESTConfig(cfg *rest.Config) *rest.Config {
	out := rest.CopyConfig(cfg)
	out.QPS = -1
	out.RateLimiter = nil
	return out
}
