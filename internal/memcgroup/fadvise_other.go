//go:build !linux

package memcgroup

import (
	"errors"
	"os"
)

func fadviseDontNeed(*os.File) error {
	return errors.New("memcgroup: dropping a file from the page cache needs Linux")
}
