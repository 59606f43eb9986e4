//go:build !linux

package plog

// prefetchFile is not available here: the prefetcher stops at its first step.
type prefetchFile struct{}

func openPrefetchFile(string, int64) (*prefetchFile, error) { return nil, errNoPrefetch }
func (*prefetchFile) dataEnd() (int64, error)               { return 0, errNoPrefetch }
func (*prefetchFile) populate(int64, int64) error           { return errNoPrefetch }
func (*prefetchFile) writeback(int64, int64) error          { return errNoPrefetch }
func (*prefetchFile) close()                                {}

func dropPages(string, *prefetchFile, int64, int64) error { return errNoDrop }

// datasyncFile is never called here: the flusher is handed files only by the prefetcher.
func datasyncFile(string) error { return errNoPrefetch }
