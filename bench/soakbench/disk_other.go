//go:build !linux

package soakbench

import "errors"

func mountTmpfs(string, int) error { return errors.ErrUnsupported }

func unmount(string) error { return nil }

func fill(string) error { return errors.ErrUnsupported }
