/** This package's version: the runlock workspace's (test/package.test.ts checks both). */
export const VERSION = "0.1.0";
