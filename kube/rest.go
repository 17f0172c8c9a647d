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
// binding submitted during a storm of status patches queues in the bucket
// behind the patch of every worker that holds one — the priority order is
// lost where the scarce resource is handed out (kubernetes#135900). Two
// limits in series also make the rate the lower of the two, and the
// bucket's waits are invisible to the dispatcher's figures. The dispatcher
// takes its token before it chooses the call, so the best call at the
// moment a token is granted runs: a binding waits for one token, not for
// the storm. Only a limit of its own can do that.
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
