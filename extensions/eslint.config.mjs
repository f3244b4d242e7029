// @ts-check
// `npm run lint`: ESLint's and typescript-eslint's recommended rules on the sidebar's source.
import eslint from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['lib/', 'node_modules/', '../tgnb/labextension/'] },
  eslint.configs.recommended,
  ...tseslint.configs.recommended,
  {
    files: ['src/**/*.ts']
  }
);
