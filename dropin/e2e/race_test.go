//go:build race

package e2e

// raceEnabled says this test binary runs with the race detector, so that
// the unit tests it runs in the copy run with it too (upstreamFlags).
const raceEnabled = true
