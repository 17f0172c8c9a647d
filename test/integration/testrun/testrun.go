// Package testrun tells a TestMain which of its package's top-level tests
// go test will run, so that it prepares only what those need: the tests
// here build kube-scheduler or kube-apiserver before they start, which
// takes minutes the first time.
package testrun

import (
	"flag"
	"regexp"
	"strings"
)

// Selected reports whether go test's -test.run and -test.skip select the
// top-level test name, as the testing package matches them: each pattern's
// first /-separated element, unanchored. Call it after flag.Parse. A
// pattern that does not compile selects the test, so that the testing
// package reports the pattern.
func Selected(name string) bool {
	return selected(name, lookup("test.run"), lookup("test.skip"))
}

func lookup(name string) string {
	if f := flag.Lookup(name); f != nil {
		return f.Value.String()
	}
	return ""
}

func selected(name, run, skip string) bool {
	matches := func(pattern string) bool {
		first, _, _ := strings.Cut(pattern, "/")
		ok, err := regexp.MatchString(first, name)
		return ok || err != nil
	}
	if run != "" && !matches(run) {
		return false
	}
	// A skip pattern with several elements skips subtests only.
	if skip != "" && !strings.Contains(skip, "/") && matches(skip) {
		return false
	}
	return true
}
