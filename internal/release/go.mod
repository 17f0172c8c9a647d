// Unpublished: the release check's own tool (RELEASING.md), never tagged.
module github.com/coalescer/dispatch/internal/release

go 1.26.0

// golang.org/x/mod is the version the workspace already selects (through
// golang.org/x/tools in test/integration's and benchmarks' graphs): a newer
// one would raise x/tools, x/net and x/sys for every module in go.work.
require golang.org/x/mod v0.41.0

require (
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect
