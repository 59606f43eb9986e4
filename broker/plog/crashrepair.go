package plog

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// removeUnstartedValueLogs deletes the value-log files in dir that are empty, which Badger cannot
// open, before Badger opens the directory, and returns their paths (for the log).
//
// Why: Badger creates a value-log file (O_CREAT|O_EXCL) and only then sizes it and writes its
// header; a process killed between the two leaves a file of 0 bytes, and Badger's open of an existing
// file treats the sizing it then does as an error ("Open existing file: …: Create a new file"), so the
// node could not start again after an unlucky kill -9 (TestKill9Recovery hit it about once in twenty
// runs). Such a file holds nothing: every record Badger writes follows the header, and nothing points
// into a file before Badger's next write after creating it. Deleting the newest leaves Badger to create
// it again, as its open does for its next value log; an older one (Badger never writes into one again)
// just goes. Errors: reading dir (a missing dir is not one: a new store) or deleting a file.
func removeUnstartedValueLogs(dir string) (removed []string, err error) {
	files, err := badgerLogFiles(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list value logs in %s: %w", dir, err)
	}
	for _, f := range files {
		if !f.vlog {
			continue
		}
		path := filepath.Join(dir, f.name)
		fi, err := os.Stat(path)
		if err != nil {
			return removed, fmt.Errorf("stat value log %s: %w", path, err)
		}
		if fi.Size() != 0 {
			continue
		}
		if err := os.Remove(path); err != nil {
			return removed, fmt.Errorf("remove empty value log %s left by a crash: %w", path, err)
		}
		removed = append(removed, path)
	}
	return removed, nil
}
