package kube

import "k8s.io/client-go/rest"

// RESTConfig returns a copy of cfg for the dispatcher's own clientset,
// with client-go's client-side rate limiting turned off: QPS -1 (client-go
// makes no token bucket for a negative QPS) and no RateLimiter. The
// dispatcher limits the rate itself (Options.QPS), after it has ordered
// calls by priority.
//
// client-go's bucket would sit behind the workers: a worker has already
// taken its call when it waits there, so a binding submitted during a storm
// of status patches would queue behind the patch of every worker that holds
// one (kubernetes#135900). The dispatcher takes its token before it chooses
// the call, so a binding waits for one token, not for the storm.
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
