package e2e

// testKind is how upstream's CI runs a kind of test.
type testKind int

const (
	unit testKind = iota
	integration
)

// upstreamFlags are the go test (or build) flags upstream's CI uses:
// hack/make-rules/test.sh runs unit tests with -race when the race
// detector is available; hack/make-rules/test-integration.sh runs
// integration tests without it (KUBE_RACE="") and with -short. Under -race,
// upstream's integration framework reports a data race of its own
// (framework.EtcdMain's etcd-output logger against testing.M.Run) and its
// kube-apiserver can miss the framework's start-up timeout on two cores,
// with either dispatcher.
func upstreamFlags(kind testKind) []string {
	if kind == integration {
		return []string{"-short"}
	}
	return upstreamBuildFlags(kind)
}

// upstreamBuildFlags are upstreamFlags's build flags alone.
func upstreamBuildFlags(kind testKind) []string {
	if kind == unit && raceEnabled {
		return []string{"-race"}
	}
	return nil
}
