// Package goid tells which goroutine is running. The dispatcher uses it on
// cold paths only — Close, SetMode, a Sync-mode submission that would wait
// for its own key or the breaker's probe — to refuse a call that would wait for the very goroutine
// making it, instead of hanging.
package goid

import (
	"runtime"
	"strconv"
)

// ID returns the current goroutine's id, as runtime.Stack reports it
// ("goroutine 42 [running]:"). It costs about a microsecond; 0 means the
// header could not be read.
func ID() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	const prefix = "goroutine "
	if len(b) < len(prefix) || string(b[:len(prefix)]) != prefix {
		return 0
	}
	b = b[len(prefix):]
	i := 0
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	id, err := strconv.ParseUint(string(b[:i]), 10, 64)
	if err != nil {
		return 0
	}
	return id
}
